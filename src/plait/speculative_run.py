"""A warm start's first run, overlapped with its capture.

In a new process, the program a call captures is most often the one an earlier process compiled
for the same call. After each compile whose artifact the cache holds, a *hint* records that
artifact's key under what is known before capture (the callable's class or name, the request, the
call's structure and tensor metadata, the state's metadata, grad and inference mode). At the next
warm start, a hint found loads its artifact before capture, and the loaded program runs on this
call's inputs in a background thread, on another core, while capture runs; the call returns that
result only when

- the lookup the captured program makes (its own key: semantic hash, guards, weights) asks for
  the hinted artifact, and the specialization runs the very program that ran early;
- the captured program feeds its graph from the inputs the early run read (same graph input
  names, same call leaves and state entries, the same tensor objects, none written since: their
  version counters unchanged).

Anything else (no hint, a stale one, an early run that failed) discards the early result and the
call runs its program after capture as it would without a hint. Capture always runs: a hint only
decides what runs early, never what a call is served, so this warm start cannot serve a stale
program. The early run is off where it could not be the same run as the one it replaces: under
grad mode, a ``TorchFunctionMode`` or ``TorchDispatchMode``, the profiler, or intra-op threads
that leave no core free; and a hint is written only for a program on the CPU with no mutation,
no random or opaque call, no symbolic size and no container output. ``options={"speculative":
False}`` turns it off for one compiled callable.

Example:
    >>> import tempfile, torch
    >>> import plait
    >>> from plait.cache import LocalStore
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> lin = torch.nn.Linear(4, 4)
    >>> with torch.no_grad():
    ...     _ = plait.compile(lin, options={"cache": store})(torch.randn(2, 4))
    >>> with torch.no_grad():  # a new compiled callable: the warm start of another process
    ...     again = plait.compile(lin, options={"cache": store})
    ...     out = again(torch.randn(2, 4))
    >>> cache = again.specializations[0].manifest.cache  # with a core free for the early run:
    >>> cache.get("first run", "during capture (the hinted artifact)")
    'during capture (the hinted artifact)'
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from plait import logs
from plait.backends import Compiled, outside_inference_mode, stax_executor
from plait.cache import Store
from plait.cache.compiled import (
    LoadFailed,
    SavedCompile,
    StaleEntryError,
    hand_over,
    load_compiled,
    take_back,
)
from plait.cache.key import canonical_json, text_digest
from plait.cache.lookup import warn_at_caller
from plait.frontend import CapturedProgram
from plait.guards.guard import GuardEnv
from plait.ir.ops.registry import get_op

FORMAT = "plait.first-run-hint/1"
# NOTE: the GIL's switch interval while an early run is in flight: its thread takes the GIL
# back after each native call (a convolution, a kernel), which at the default 5 ms waits behind
# capture's Python for most of an interval each time
_SWITCH_INTERVAL = 0.0002
_SLOTS = ("user", "state")
# NOTE: the switch interval is the process's: the early runs in flight (calls in other threads
# overlap theirs) and the interval before the first of them, restored when the last one ends
_LOWERED: list[float] = []
_LOWERED_LOCK = threading.Lock()
_IN_FLIGHT = [0]


def _lower_switch_interval() -> None:
    with _LOWERED_LOCK:
        if _IN_FLIGHT[0] == 0:
            _LOWERED[:] = [sys.getswitchinterval()]
            sys.setswitchinterval(min(_LOWERED[0], _SWITCH_INTERVAL))
        _IN_FLIGHT[0] += 1


def _restore_switch_interval() -> None:
    with _LOWERED_LOCK:
        _IN_FLIGHT[0] -= 1
        if _IN_FLIGHT[0] == 0:
            sys.setswitchinterval(_LOWERED.pop())


def _free_core() -> bool:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # NOTE: no affinity on this platform
        cores = os.cpu_count() or 1
    return cores > torch.get_num_threads()


def _describe_leaf(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return [
            type(x).__qualname__,
            str(x.dtype),
            list(x.shape),
            list(x.stride()),
            str(x.device),
            x.requires_grad,
        ]
    if x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device)):
        return [type(x).__qualname__, repr(x)]
    return [type(x).__qualname__]


def hint_key(fn: Any, request: dict[str, Any], env: GuardEnv) -> str | None:
    """The key a hint for this call is kept under (None: this callable has no stable name).
    Only a prediction: what the hint names is checked against the captured program."""
    owner = type(fn) if isinstance(fn, torch.nn.Module) else fn
    name = getattr(owner, "__qualname__", None)
    code = getattr(owner, "__code__", None)
    if name is None:
        return None
    where = [code.co_filename, code.co_firstlineno] if code is not None else None
    state = [[str(t.dtype), list(t.shape), str(t.device)] for t in env.state]
    parts = {
        "format": FORMAT,
        "callable": [getattr(owner, "__module__", None), name, where],
        "request": repr(sorted(request.items())),
        "inputs": [repr(env.spec), [_describe_leaf(x) for x in env.leaves]],
        "state": state,
        "mode": [torch.is_inference_mode_enabled(), str(torch.get_default_dtype())],
    }
    return text_digest(canonical_json(parts))


def _inputs_record(prog: CapturedProgram) -> list[list[Any]]:
    inputs = prog.interface()[0]
    record: list[list[Any]] = []
    for v, slot in zip(inputs, prog.inputs):
        ref = slot.ref if slot.source in _SLOTS else None
        record.append([v.name, slot.source, ref])
    return record


def _hintable(prog: CapturedProgram, compiled: Compiled) -> bool:
    """A program whose early run is the same run as the one after capture: on the CPU, with
    no write to its inputs, no random or opaque call, no symbolic size, no container output."""
    graph = compiled.graph
    if compiled.program is None or graph is None or prog.graph is None:
        return False
    if compiled.manifest.cache.get("status") not in ("hit", "miss"):
        return False
    if prog.mutations or prog.containers or prog.symbolic_dims():
        return False
    for v in graph.inputs:
        device = getattr(v.type, "device", "cpu")
        if device != "cpu":
            return False
    return not any(n.op == "opaque" or get_op(n.op).is_random(n.attrs) for n in graph.nodes)


def may_speculate() -> bool:
    """Whether an early run can be the same run as the call's own (this thread's settings)."""
    if torch.is_grad_enabled() or not _free_core():
        return False
    if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
        return False
    return not torch._C._autograd._profiler_enabled()


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _gather(
    hint: dict[str, Any], leaves: Sequence[Any], state: Sequence[torch.Tensor]
) -> tuple[list[str], list[Any]] | None:
    """The captured graph's input names and this call's values for them, as the hint says
    (None for a constant); None when the hint is malformed or an input is an inference tensor
    (it has no version counter: a write to it while the early run reads it would not show) or
    a tensor subclass (its ``__torch_function__`` is the user's Python, which the early run
    would run in its thread while capture runs, and run again when the result is dropped)."""
    inputs = hint.get("inputs")
    if not isinstance(inputs, list):
        return None
    names, values = [], []
    for entry in inputs:
        if not isinstance(entry, list) or len(entry) != 3:
            return None
        name, source, ref = entry
        value = None
        if source == "user" and isinstance(ref, int) and 0 <= ref < len(leaves):
            value = leaves[ref]
        elif source == "state" and isinstance(ref, int) and 0 <= ref < len(state):
            value = state[ref]
        if isinstance(value, torch.Tensor) and (value.is_inference() or type(value) not in _PLAIN):
            return None
        names.append(str(name))
        values.append(value)
    return names, values


class SpeculativeRun:
    """One early run: the hinted artifact, loaded, running on the call's inputs in a thread.
    :meth:`close` waits for it and hands back what it loaded; call it once the call ends."""

    def __init__(self, store: Store, hint: dict[str, Any], saved: SavedCompile | None) -> None:
        self.store, self.hint, self.saved = store, hint, saved
        self.artifact: str = hint["artifact"]
        self.values: list[Any] = []
        self.versions: list[tuple[torch.Tensor, int]] = []
        self.results: Sequence[Any] | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.lowered = False
        self.why = "not run"

    @classmethod
    def start(
        cls, store: Store, key: str, env: GuardEnv, state: Sequence[torch.Tensor]
    ) -> SpeculativeRun | None:
        """Read the hint under ``key``, load its artifact and start its run on this call's
        inputs; None when there is no usable hint (nothing is left running then)."""
        try:
            payload = store.get(key)
            hint = json.loads(bytes(payload)) if payload is not None else None
        except Exception as exc:  # NOTE: a damaged hint only predicts nothing
            logs.emit("cache", "first_run", f"no early run: the hint did not load ({exc})")
            return None
        if not isinstance(hint, dict) or hint.get("format") != FORMAT:
            return None
        artifact = hint.get("artifact")
        gathered = _gather(hint, env.leaves, state)
        if not isinstance(artifact, str) or gathered is None:
            return None
        try:
            with outside_inference_mode():  # NOTE: as the lookup loads it
                saved = load_compiled(store, artifact)
        except Exception as exc:
            # NOTE: reported by the lookup that asks for it (as its own), or by close()
            hand_over(store, artifact, LoadFailed(exc))
            failed = cls(store, hint, None)
            failed.why = "after capture: the hinted artifact did not load"
            return failed
        if saved is None or saved.program is None:
            return None
        run = cls(store, hint, saved)
        hand_over(store, artifact, saved)
        try:
            launched = run._launch(*gathered)
        except Exception as exc:  # NOTE: no thread (RuntimeError): the call runs as without one
            logs.emit("cache", "first_run", f"no early run: it did not start ({exc})")
            launched = False
        if not launched:
            take_back(store, artifact)
            return None
        return run

    def _launch(self, names: list[str], values: list[Any]) -> bool:
        assert self.saved is not None
        graph = self.saved.graph
        index = {name: i for i, name in enumerate(names)}
        for v in graph.inputs:
            i = index.get(v.name)
            if v.name not in graph.constants and (i is None or values[i] is None):
                return False  # NOTE: a live constant, or an input the hint does not name
        execute = stax_executor(names, graph, self.saved.program)
        self.values = values
        self.versions = [(t, t._version) for t in values if isinstance(t, torch.Tensor)]
        inference = torch.is_inference_mode_enabled()

        def run() -> None:
            try:
                with torch.no_grad(), torch.inference_mode(inference):
                    self.results = execute(values)
            except BaseException as exc:  # NOTE: the call after capture raises it, if real
                self.error = exc

        thread = threading.Thread(target=run, name="plait-early-run", daemon=True)
        thread.start()  # NOTE: first: a thread that does not start leaves nothing to undo
        self.thread = thread
        _lower_switch_interval()
        self.lowered = True
        return True

    def _wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.lowered:
            _restore_switch_interval()
            self.lowered = False

    def executor_for(self, prog: CapturedProgram, compiled: Compiled) -> Any:
        """The executor of the call that captured ``prog``: the early run's results where they
        are this call's, else the specialization's own executor (which runs now); None for a
        specialization that runs no executor."""
        execute = compiled.executor
        if execute is None:
            return None

        def run(values: list[Any]) -> Sequence[Any]:
            results = self._results(prog, compiled, values)
            compiled.manifest.cache["first run"] = self.why
            logs.emit("cache", "first_run", f"first run {self.why}")
            return execute(values) if results is None else results

        return run

    def _results(
        self, prog: CapturedProgram, compiled: Compiled, values: list[Any]
    ) -> Sequence[Any] | None:
        self._wait()
        if self.saved is None:
            return None
        if compiled.program is not self.saved.program:
            self.why = "after capture: the captured program's key is not the hinted artifact"
        elif self.error is not None:
            self.why = f"after capture: the early run failed ({type(self.error).__name__})"
        elif _inputs_record(prog) != self.hint.get("inputs") or prog.mutations:
            self.why = "after capture: the program reads other inputs than the hint's"
        elif len(values) != len(self.values) or any(
            a is not b for a, b in zip(values, self.values)
        ):
            self.why = "after capture: the call's inputs are not those the early run read"
        elif any(t._version != v for t, v in self.versions):
            self.why = "after capture: an input was written while the early run read it"
        else:
            self.why = "during capture (the hinted artifact)"
            return self.results
        return None

    def close(self) -> str:
        """Wait for the run, hand back an artifact the lookup did not take; what happened."""
        self._wait()
        left = take_back(self.store, self.artifact)
        if isinstance(left, LoadFailed):  # NOTE: an entry no lookup asked for: reported here
            message = str(left.error)
            if isinstance(left.error, StaleEntryError):  # NOTE: as the lookup would have done
                with contextlib.suppress(OSError):  # NOTE: an unusable index costs the removal
                    self.store.delete(self.artifact)
                message = f"cache entry {self.artifact[:16]}… discarded: {message}"
            warn_at_caller(f"plait cache: {message}")
        self.results = None
        return self.why


def speculate(
    enabled: bool, store: Store | None, fn: Any, request: dict[str, Any], env: GuardEnv
) -> tuple[str | None, SpeculativeRun | None]:
    """Before a capture: the key of this call's hint (None: no hint is read or written) and
    the early run its hint started, if any. ``enabled``: the callable's first compile, at the
    top of its tree, with ``options={"speculative": ...}`` on."""
    if not enabled or store is None or not may_speculate():
        return None, None
    key = hint_key(fn, request, env)
    if key is None:
        return None, None
    return key, SpeculativeRun.start(store, key, env, env.state)


def write_hint(
    store: Store,
    key: str,
    prog: CapturedProgram,
    compiled: Compiled,
    early: SpeculativeRun | None,
) -> None:
    """After a compile: record its artifact under ``key`` for the next process's early run
    (nothing when the program cannot run early, or the hint already says so)."""
    if not _hintable(prog, compiled):
        return
    artifact = str(compiled.manifest.cache.get("key"))
    record = {"format": FORMAT, "artifact": artifact, "inputs": _inputs_record(prog)}
    if early is not None and early.hint == record:
        return
    payload = json.dumps(record, sort_keys=True).encode()
    start = time.perf_counter()
    try:
        store.put(key, payload, {"kind": "first-run hint"})
    except (OSError, ValueError) as exc:
        logs.emit("cache", "first_run", f"the first-run hint could not be saved ({exc})")
        return
    compiled.manifest.timings["cache.hint"] = time.perf_counter() - start

"""plait's public entry points: :func:`capture` and :func:`compile`.

``compile`` returns a callable with the program's calling convention. It captures on the first
call, keeps each specialization behind its guards, runs the graph with a backend (``"eager"``:
plait's reference interpreter), and on a guard failure captures a new specialization, recording
the reason (which guard, expected and actual value).

Example:
    >>> import torch, plait
    >>> @plait.compile
    ... def f(x):
    ...     return x.relu() if x.shape[0] > 2 else x.sigmoid()
    >>> y = f(torch.randn(4, 8))
    >>> y = f(torch.randn(1, 8))
    >>> len(f.specializations), f.recompile_reasons[0].split(":")[0]
    (2, 'x.shape[0] > 2')
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from plait import logs
from plait.backend_choice import default_backend
from plait.backends import (
    BACKENDS,
    KNOWN_OPTIONS,
    Compiled,
    CompileRequest,
    Continued,
    compile_program,
    run_captured,
)
from plait.cache import Store, check_store_option, resolve_store
from plait.cache.remote_copies import start_copies
from plait.cache.snapshots import forget_snapshot
from plait.cache.weight_digests import forget, prefetch
from plait.capturing import CAPTURE_LOCK, Captured, capture, check_kinds, report_fallbacks
from plait.collector import collector_paused
from plait.compiled_callables import CompiledFunction, CompiledModule, _Copyable
from plait.distributed.ddp import release_by_bucket
from plait.dynamic_shapes import DynamicShapes, SymbolicRefused, symbol_sizes
from plait.errors import (
    CaptureFallbackWarning,
    CompiledInputError,
    GraphCaptureError,
    InvalidArgumentTypeError,
    InvalidOptionError,
    PlaitCompileError,
    RecompileLimitError,
)
from plait.frontend import CapturedProgram, Executor, InputAdapter, ModuleState, capture_program
from plait.frontend.dynamic_dims import AutomaticDims, DimPolicy, DynamicSpec
from plait.guards.guard import Evaluators, GuardEnv
from plait.guards.native import EVALUATORS as NATIVE_GUARDS
from plait.guards.state import StateFetcher
from plait.manifest import Explanation, SpecializationReport
from plait.protocol_engine import ProtocolEngine
from plait.region_engine import RegionEngine
from plait.regions import RegionPlan, RegionTree, call_forward, can_split, object_argument
from plait.settings import call_state
from plait.snapshots.deps import CodeRecorder, recording
from plait.snapshots.snapshot import SnapshotUnreadable
from plait.specialization import (
    LookupOrder,
    Specialization,
    SpecializationMissError,
    SpecializationUse,
    log_specialization,
)
from plait.speculative_run import SpeculativeRun, speculate, write_hint
from plait.warm_start import from_snapshot, save_after_capture, warm_start_option

__all__ = [
    "Captured",
    "CompiledFunction",
    "CompiledModule",
    "GraphCaptureError",
    "Specialization",
    "SpecializationMissError",
    "SpecializationUse",
    "capture",
    "compile",
    "explain",
]

DEFAULT_RECOMPILE_LIMIT = 8
_ENGINE_OPTIONS = ("recompile_limit", "on_recompile_limit", "cache", "warm_start", "speculative")
# NOTE: what each mode sets (options a user gave explicitly win): "max-autotune" spends compile
# time timing each Triton kernel's launch shapes on the device (StaxOptions.triton_autotune)
_MODES: dict[str | None, dict[str, Any]] = {
    None: {},
    "default": {},
    "max-autotune": {"triton_autotune": True},
}


# --- compile ---------------------------------------------------------------------------------
def _call_name(fn: Any) -> str:
    """How errors name a compiled callable: ``plait-compiled ResNet`` (a module's class) or
    ``plait-compiled f`` (a function's qualified name)."""
    if isinstance(fn, nn.Module):
        return f"plait-compiled {type(fn).__name__}"
    return f"plait-compiled {getattr(fn, '__qualname__', type(fn).__name__)}"


class _Engine(RegionEngine, DynamicShapes, ProtocolEngine):
    """The specialization cache shared by CompiledFunction and CompiledModule.

    Each call flattens its inputs, fetches the module's live state and tries the
    specializations, stale ones last (:class:`LookupOrder`; the fast path). A
    miss captures and compiles a new one (through the artifact cache) with the failed guards as
    its reason, up to the recompile limit: past it, a clear error, or with
    ``on_recompile_limit="eager"`` the original program, run eagerly, warned once and recorded
    for :func:`explain`.

    NOTE: thread safety. The fast path takes no lock (it reads the lookup order's tuple). A miss
    holds the process-wide capture lock, then ``self.lock``, and looks again (:meth:`_admitted`:
    another thread may have added one meanwhile) before capturing: first calls capture once."""

    # NOTE: what runs its specializations' guards (and its regions'), injected here
    guard_evaluators: Evaluators | None = NATIVE_GUARDS

    def __init__(
        self,
        fn: Callable[..., Any],
        backend: str | None,
        fullgraph: bool,
        dynamic: DynamicSpec,
        mode: str | None,
        options: dict[str, Any] | None,
        *,
        tree: RegionTree | None = None,
        path: str = "",
        share: bool = False,
    ) -> None:
        if backend is not None and backend not in BACKENDS:
            raise InvalidOptionError(f"unknown backend {backend!r}; available: {list(BACKENDS)}")
        if mode not in _MODES:
            raise InvalidOptionError(f"mode {mode!r} is not available; modes: {list(_MODES)}")
        options = dict(options or {})
        self.requested = (backend, dynamic, mode, dict(options))  # NOTE: for region engines
        if _MODES[mode]:
            options["stax"] = {**_MODES[mode], **dict(options.get("stax") or {})}
        self.recompile_limit = int(options.pop("recompile_limit", DEFAULT_RECOMPILE_LIMIT))
        self.on_limit = options.pop("on_recompile_limit", "raise")
        if self.on_limit not in ("raise", "eager"):
            raise InvalidOptionError(
                f"on_recompile_limit must be 'raise' or 'eager', got {self.on_limit!r}"
            )
        self.cache = options.pop("cache", True)
        self.warm_start = warm_start_option(options.pop("warm_start", "capture"))
        self.speculative = bool(options.pop("speculative", True))
        check_store_option(self.cache)  # NOTE: a wrong value fails here, not at the first call
        unknown = sorted(set(options) - set(KNOWN_OPTIONS))
        if unknown:
            known = [*_ENGINE_OPTIONS, *KNOWN_OPTIONS]
            raise InvalidOptionError(f"unknown options {unknown}; known: {known}")
        self.options = options
        DimPolicy.of(dynamic)  # NOTE: a malformed dynamic= fails here, not at the first call
        if tree is not None and isinstance(dynamic, dict):
            dynamic = None  # NOTE: a mapping names the root call's arguments, not a region's
        self.fn, self.backend, self.fullgraph, self.dynamic = fn, backend, fullgraph, dynamic
        # NOTE: dynamic=None: static first, then the dims seen changing (frontend.dynamic_dims)
        self.automatic = AutomaticDims() if dynamic is None else None
        # NOTE: a region's call is passed on as its parent made it (positional and keyword
        # arguments as they came): a decorated forward fills in keywords, a pre-hook arguments
        self.adapter = InputAdapter(fn, passthrough=tree is not None)
        self.state = ModuleState(fn) if isinstance(fn, nn.Module) else None
        self.fetch: Callable[[], Sequence[torch.Tensor]] = (
            StateFetcher(self.state) if self.state is not None else tuple
        )
        self.specializations: list[Specialization] = []
        self.recompile_reasons: list[str] = []
        self.limit_fallback: dict[str, Any] | None = None  # on_recompile_limit="eager", once hit
        self.lock = threading.RLock()
        self.lookup = LookupOrder(self.lock)  # NOTE: the order calls try specializations in
        # NOTE: regional compilation (plait.regions): a region engine compiles one submodule's
        # forward (its hooks run eagerly around it); the root gets a tree when capture falls back
        self.tree, self.region, self.path = tree, tree is not None, path
        self.share = share  # identical blocks in the tree share this engine's programs
        self.call_target: Callable[..., Any] = fn
        if self.region and isinstance(fn, nn.Module):
            self.call_target = functools.partial(call_forward, fn)
        self.regions: RegionPlan | None = None  # the plan its fallback specializations run
        self.refused: str | None = None  # why a region runs eagerly on every call, if it does
        self._refusal_warned = False
        self.hooked: str | None = None  # why its latest calls ran split (hooks below it)
        self.split_calls = 0  # NOTE: calls that ran split for that reason (hooks, an object)
        # NOTE: what the call being captured runs or returns where refused (prog.this_call)
        self.ran_once: CapturedProgram | Continued | None = None
        self.early: SpeculativeRun | None = None

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        if self.refused is not None:
            return self._eager(args, kwargs)
        try:
            spec, leaves, paths = self.adapter.flatten(args, kwargs)
        except TypeError as exc:
            raise CompiledInputError(str(exc)) from None
        why = object_argument(leaves, paths, self.region)
        if why is not None:
            return self.unsupported_call(args, kwargs, why)
        state = self.fetch()
        env = GuardEnv(spec, leaves, self.fn, state)
        s = self.lookup.first_holding(env)
        if s is not None:
            s.calls += 1
            return self._run(s, env, state, args, kwargs)
        # NOTE: the miss path, inline: warnings count the frames up to the user's call
        early = None  # NOTE: the warm start's early run (plait.speculative_run), if one started
        try:
            with self._tree_lock(), CAPTURE_LOCK, self.lock, collector_paused():
                self.ran_once = None
                try:
                    found = self._admitted(env) or self._recapture(env, paths, args, kwargs)
                except (RecompileLimitError, Warning):
                    raise  # NOTE: a warning raised as an error (a filter) is the user's to see
                except Exception as exc:
                    if not self.region:
                        raise
                    # NOTE: a region its parent's eager Python reached, that the whole program's
                    # capture never did: its failure must not fail a call that ran eagerly before
                    found = None
                    self.refused = f"its capture or compile failed: {type(exc).__name__}: {exc}"
                finally:
                    early, self.early = self.early, None
                ran, self.ran_once = self.ran_once, None
            if self.refused is not None and found is None:
                return self._refuse(args, kwargs, self.refused)
            if found is None:
                return self._limit_call(args, kwargs)
            s, env, state = found
            s.calls += 1
            if ran is not None and s.executor is None:  # NOTE: its Python ran, at capture
                self.ran_at_capture()
                objects = self.adapter.containers(args, kwargs, env.spec) if ran.containers else ()
                return run_captured(ran, env, state, objects, self._name())
            execute = early.executor_for(s.program, s.compiled) if early is not None else None
            return self._run(s, env, state, args, kwargs, execute)
        finally:
            if early is not None:
                early.close()
            start_copies()  # NOTE: a remote entry's local copy, once the call it served ended

    region_call = __call__

    def _admitted(
        self, env: GuardEnv
    ) -> tuple[Specialization, GuardEnv, Sequence[torch.Tensor]] | None:
        """Under the locks, after a miss: the specialization another thread added meanwhile
        for this call, if one admits it."""
        state = self.fetch()
        env = GuardEnv(env.spec, env.leaves, self.fn, state)
        for s in self.specializations:
            if s.guards.holds(env):
                return s, env, state
        return None

    def _recapture(
        self, env: GuardEnv, paths: list[str], args: tuple, kwargs: dict
    ) -> tuple[Specialization, GuardEnv, Sequence[torch.Tensor]] | None:
        reason = None
        settings = call_state()
        store = resolve_store(self.cache)
        if self.specializations:
            last = self.specializations[-1]
            if not self.region:  # NOTE: a region's calls are its parent's, not the user's
                check_kinds(last.program, env, paths)
            failures = last.guards.explain(env) or ["no guard failed (internal)"]
            reason = "; ".join(failures)
            message = f"{self._name()}: recompiling: {reason}"
            logs.emit("guards", "recompile", message, failed=failures)
            if len(self.specializations) >= self.recompile_limit:
                self._limit_reached(reason)
                return None
            if self.automatic is not None:
                programs = [s.program for s in self.specializations]
                self.automatic.observe(programs, env.leaves, paths)
        elif self.automatic is not None and store is not None:
            self._load_automatic(store, env)
        if self.state is not None and not self.state.structure_intact():
            self.state = ModuleState(self.state.module)
            self.fetch = StateFetcher(self.state)
        start = time.perf_counter()
        forget()  # NOTE: a new compile step: no digest of an earlier one names this key
        shared = self.tree.shared_program(self, env, paths) if self.share and self.tree else None
        prog: CapturedProgram | None = shared
        hint = None
        if shared is not None:
            parts, note, seconds, recorder = None, "shared", {}, None
        else:
            if store is not None and self.options.get("freeze", not torch.is_grad_enabled()):
                prefetch(env.state)  # NOTE: the key's weights digest, hashed while it loads
            prog, parts, note = from_snapshot(self.warm_start, store, self._front_request(),
                                              self.fn, env, paths, self.state)  # fmt: skip
            seconds = {"cache.snapshot": time.perf_counter() - start}
            recorder = None
            if prog is None:
                first = self.speculative and not self.region and not self.specializations
                hint, self.early = speculate(first, store, self.fn, self._front_request(), env)
                prog, recorder = self._capture(args, kwargs, parts is not None, seconds)
        assert prog is not None
        report_fallbacks(prog, stacklevel=4, region=self._region_name(), tree=self.tree)
        state = self.fetch()
        spec = self._shared_specialization(prog, env, state, reason, settings)
        if spec is None:
            try:
                try:
                    compiled = self._compile(prog, state, store, env)
                except SymbolicRefused as refused:
                    prog, compiled = self._without_symbols(prog, refused, args, kwargs, state, env)
                    recorder = None
            except SnapshotUnreadable as exc:
                # NOTE: a snapshot whose nodes do not parse (they are read only when the
                # artifact misses): removed, and the call captured as if there had been none
                forget_snapshot(store, exc.key)
                note = f"captured: the snapshot did not load ({exc})"
                prog, recorder = self._capture(args, kwargs, parts is not None, seconds)
                compiled = self._compile(prog, state, store, env)
            compiled.manifest.timings.update(seconds)
            if store is not None:
                if recorder is not None and parts is not None:
                    note = save_after_capture(store, parts, prog, recorder, compiled, note)
                compiled.manifest.cache["capture"] = note
            if hint is not None and store is not None:
                write_hint(store, hint, prog, compiled, self.early)
            reason = self._report_dynamic(prog, compiled, reason, store, env)
            spec = Specialization(
                prog, compiled, reason, settings, evaluators=self.guard_evaluators
            )
            if self.share and self.tree is not None:
                self.tree.publish_artifact(self, prog, settings, compiled)
        if self.share and self.tree is not None and shared is None:
            self.tree.publish_program(self, prog)
        self.specializations.append(spec)
        self.lookup.add(spec)
        log_specialization(self._name(), len(self.specializations) - 1, spec)
        if self.tree is not None:
            self.tree.version += 1
        module = self.fn
        if self.regions is None and not self.fullgraph and can_split(module, prog):
            assert isinstance(module, nn.Module)
            if self.tree is None:
                self.tree = RegionTree(module, self._make_region, self)
            self.regions = RegionPlan(self.tree, module, self.path)
        if reason is not None:
            self.recompile_reasons.append(reason)
        return spec, GuardEnv(env.spec, env.leaves, self.fn, state), state

    def _capture(
        self, args: tuple, kwargs: dict, record: bool, seconds: dict[str, float]
    ) -> tuple[CapturedProgram, CodeRecorder | None]:
        start = time.perf_counter()
        if self.tree is not None and self.region:
            self.tree.counts["captures"] += 1
        with recording(record) as recorder:
            prog = capture_program(
                self.call_target,
                args,
                kwargs,
                fullgraph=self.fullgraph,
                dynamic=self._capture_dynamic(),
                adapter=self.adapter,
                module_state=self.state,
                arithmetic="skip",  # NOTE: compiling reads the graph, never capture's values
                continuation=True,  # NOTE: docs/capture.md
            )
        seconds["capture"] = time.perf_counter() - start
        self.ran_once, prog.this_call = prog.this_call, None
        return prog, recorder

    def _compile(
        self,
        prog: CapturedProgram,
        state: Sequence[torch.Tensor],
        store: Store | None,
        env: GuardEnv,
        backend: str | None = None,
        why: str = "requested",
    ) -> Compiled:
        from plait.codegen.symbolic_shapes import size_hints

        backend = backend or self.backend
        chosen = backend is None
        if backend is None:
            backend, why = default_backend(prog, state)
        grads = tuple(isinstance(x, torch.Tensor) and x.requires_grad for x in env.leaves)
        request = CompileRequest(
            prog, backend, self.fullgraph, self.options, state, store, grads, _call_name(self.fn)
        )
        if self.tree is not None and self.region and prog.has_graph:
            self.tree.counts["compiles"] += 1
        try:
            # NOTE: a symbolic program's dry runs run at this call's sizes
            with size_hints(symbol_sizes(prog, env)):
                compiled = compile_program(request)
        except Exception as exc:
            # NOTE: any stage (codegen, the training graphs' ATen nodes) may refuse a symbolic
            # size: the caller specializes or interprets, loudly (dynamic_shapes)
            if chosen and backend == "stax" and prog.symbolic_dims():
                raise SymbolicRefused(_refusal(exc)) from exc
            raise
        compiled.manifest.options["backend_choice"] = why
        release_by_bucket(compiled, prog, state)  # NOTE: under DDP's forward only
        return compiled

    def _front_request(self) -> dict[str, Any]:
        """What the front key records of this engine's request."""
        request = {
            "backend": self.backend,
            "fullgraph": self.fullgraph,
            "dynamic": self._dynamic_record(),
            "options": self.options,
        }
        if self.region:  # NOTE: its forward is captured, not the module's __call__ (hooks)
            request["region"] = True
        return request

    def _name(self) -> str:
        return f"region {self.path} ({self.adapter.name})" if self.region else self.adapter.name

    def _limit_reached(self, reason: str) -> None:
        """NOTE: never silent: an error by default; the eager fallback warns once and is
        recorded (``plait.explain``) with every call it ran (:meth:`_limit_call`)."""
        name = self._name()
        logs.emit("guards", "recompile_limit", f"{name}: the recompile limit refused a call")
        message = (
            f"{name}: reached the recompile limit "
            f"({self.recompile_limit} specializations); this call failed: {reason}"
        )
        if self.on_limit == "raise":
            raise RecompileLimitError(
                f"{message}. Raise it with options={{'recompile_limit': n}}, use dynamic=True "
                "when sizes vary, or options={'on_recompile_limit': 'eager'} to run such calls "
                "eagerly."
            )
        if self.limit_fallback is None:
            text = f"plait runs calls that miss every specialization eagerly: {message}"
            if self.tree is not None and self.region:
                self.tree.warn(text)
            else:
                warnings.warn(text, CaptureFallbackWarning, stacklevel=5)
            self.limit_fallback = {"reason": message, "calls": 0}
            module = self.fn
            if self.region and self.regions is None and isinstance(module, nn.Module):
                assert self.tree is not None
                if any(True for _ in module.children()):
                    self.regions = RegionPlan(self.tree, module, self.path)

    def _limit_call(self, args: tuple, kwargs: dict) -> Any:
        assert self.limit_fallback is not None
        self.limit_fallback["calls"] += 1
        return self._eager(args, kwargs)

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        """The program as written; split into regions where its module's capture fell back."""
        if self.regions is not None:
            return self.regions.run(self.call_target, args, kwargs)
        if self.tree is not None and self.region:
            with self.tree.counting(self.path):
                return self.call_target(*args, **kwargs)
        return self.call_target(*args, **kwargs)

    def _run(
        self,
        s: Specialization,
        env: GuardEnv,
        state: Sequence[torch.Tensor],
        args: tuple,
        kwargs: dict,
        execute: Executor | None = None,  # NOTE: instead of s.executor (an early run's results)
    ) -> Any:
        if s.executor is None:
            return self._eager(args, kwargs)  # the recorded eager fallback, or its regions
        if self.tree is not None and self.region:
            self.tree.note_compiled(self.path, s.program)
        prog, execute = s.program, execute or s.executor
        if prog.containers:  # NOTE: it writes back or returns an input object (a KV cache)
            return prog.run(execute, env, state, self.adapter.containers(args, kwargs, env.spec))
        return prog.run(execute, env, state)


def _refusal(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PlaitCompileError) else f"{type(exc).__name__}: {exc}"


def compile(
    model_or_fn: Any = None,
    *,
    backend: str | None = None,
    fullgraph: bool = False,
    dynamic: DynamicSpec = None,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Compile an ``nn.Module`` or a function; usable as ``@plait.compile`` or
    ``@plait.compile(backend="eager", ...)``.

    ``backend``: ``"stax"`` (native C++ kernels and PyTorch externs), ``"eager"`` (plait's
    reference interpreter), or ``None``: Stax for CPU programs and static CUDA ones, the
    interpreter otherwise, with the choice recorded in each specialization's manifest.
    ``dynamic``: which input dims are symbolic (one specialization serves their sizes):
    ``None``, the default, is automatic (static first; a dim seen changing becomes symbolic at
    the recompile: :mod:`plait.dynamic_shapes`), ``False`` specializes every size, ``True``
    makes every dim symbolic, ``{"x": {0: "batch"}}`` the named ones
    (:mod:`plait.frontend.dynamic_dims`). ``fullgraph=True`` makes any
    capture fallback or Stax fallback an error. With ``fullgraph=False`` a module whose call
    cannot be captured whole runs its own Python eagerly and its largest capturable submodules
    compiled, identical blocks sharing one artifact (:mod:`plait.regions`; ``plait.explain``
    lists the regions and boundaries). ``options``: ``recompile_limit`` (default 8),
    ``on_recompile_limit`` (``"raise"``, the default, or ``"eager"``: run calls past the limit
    eagerly, warned once and recorded), ``cache`` (the artifact cache: ``True``, the default,
    for ``$PLAIT_CACHE_DIR`` or the per-user cache directory; ``False``; a directory; a
    :class:`plait.cache.Store`), ``warm_start`` (``"capture"``, the default: a new process
    captures the program and loads its compiled artifact from the cache; ``"fingerprint"``: a
    snapshot of the captured program replaces capture when the model's fingerprint matches,
    faster and blind to what docs/cache.md lists), ``passes`` (a pipeline such as
    ``"canonicalize,cse,dce"``, or ``"inference"``, ``"training"``, ``"none"``), ``freeze``
    (default: when no gradient can flow), ``stax`` (a dict of
    :class:`plait.runtime.StaxOptions` fields). ``mode="max-autotune"``: Triton kernels'
    launch shapes timed on the device (``stax={"triton_autotune": True}`` unless given).

    Example:
        >>> import torch, plait
        >>> model = torch.nn.Linear(4, 2)
        >>> cm = plait.compile(model, backend="eager")
        >>> torch.equal(cm(torch.ones(1, 4)), model(torch.ones(1, 4)))
        True
        >>> list(cm.state_dict()) == list(model.state_dict())
        True
    """
    if model_or_fn is None:
        return functools.partial(
            compile,
            backend=backend,
            fullgraph=fullgraph,
            dynamic=dynamic,
            mode=mode,
            options=options,
        )
    engine = _Engine(model_or_fn, backend, fullgraph, dynamic, mode, options)
    again = dict(backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=options)
    if isinstance(model_or_fn, nn.Module):
        return CompiledModule(model_or_fn, engine, again)
    if not callable(model_or_fn):
        raise InvalidArgumentTypeError(
            f"plait.compile expects an nn.Module or a function, got {type(model_or_fn).__name__}"
        )
    return CompiledFunction(model_or_fn, engine, again)


def recompiled(target: Any, compile_kwargs: dict[str, Any], state: dict | None = None) -> Any:
    """``compile(target, **compile_kwargs)``: what a copied or unpickled compiled callable
    becomes (its module or function, copied, compiled afresh with the same arguments; programs
    come from the artifact cache, never from the copied object). ``state``: a compiled
    module's own hook tables."""
    out = compile(target, **compile_kwargs)
    if state:
        out.__dict__.update(state)
    return out


_Copyable.recompile = recompiled


def explain(compiled: Any) -> Explanation:
    """The specializations of a compiled callable, with guards, recompile reasons and manifests;
    for a module compiled in regions, ``.regions``: its regions, boundaries and op shares.

    Example:
        >>> import torch, plait
        >>> f = plait.compile(lambda x: x * 2 + 1, backend="eager")
        >>> _ = f(torch.randn(3))
        >>> report = plait.explain(f)
        >>> len(report.specializations), report.specializations[0].reason is None
        (1, True)
    """
    engine = getattr(compiled, "_plait", None)
    if not isinstance(engine, _Engine):
        own = getattr(type(compiled), "__plait_explanation__", None)
        if own is not None:  # NOTE: a loaded export artifact (plait.load) explains its builds
            return own(compiled)
        raise InvalidArgumentTypeError(
            f"plait.explain expects what plait.compile returned, got {type(compiled).__name__}"
        )
    reports = [
        SpecializationReport(i, s.reason, s.guards.texts(), s.manifest, s.guards.evaluator)
        for i, s in enumerate(engine.specializations)
    ]
    regions = engine.tree.report() if engine.tree is not None else None
    return Explanation(engine.adapter.name, reports, engine.limit_fallback, regions)

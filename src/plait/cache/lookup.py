"""One compile through the artifact cache: its key, the lookup, the save, and what happened.

The key's parts (recorded in the manifest's ``cache_key``): ``source`` (the semantic hash capture
minted), ``guards`` (every capture guard as process-independent text, and the frozen tensors by
name), ``target`` (backend and devices), ``options`` (as requested and as resolved: pipeline,
freeze), ``toolchain`` (Python, PyTorch, plait's version and a digest of its code, and for
Stax the C++ compiler's version and flags),
``ambient`` (the call settings and the process settings: CPU features, GPU capability, PyTorch's
build) and ``weights`` (the hash of the frozen tensors' values; parameters that stay graph inputs
never enter it). A program with a guard on an object of this process (an argument compared by
identity) is compiled and never cached, and the manifest says why.

What happened goes to the manifest's ``cache`` section: ``hit`` (with the ``tier`` that served
it, ``local`` or ``remote``, where the store has tiers), or ``miss`` with the key part that
differs from the nearest entry, and every corrupt or stale entry that was discarded and rebuilt
(also warned as :class:`CacheWarning`), and what a remote tier did (an entry read or published,
an outage).

Example:
    >>> freeze_candidates.__doc__.split(":")[0]
    'The parameters and buffers the freeze pass of ``pipeline`` would make constants'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from typing import Any, Protocol, TypeVar

import torch

from plait import logs
from plait.cache import code_identity
from plait.cache.compiled import SavedCompile, StaleEntryError, load_compiled, save_compiled
from plait.cache.key import CacheKey, explain_miss
from plait.cache.store import CorruptEntryError, Store
from plait.cache.weight_digests import weights_digest
from plait.codegen import build
from plait.errors import InternalValueError, PlaitWarning
from plait.frontend import CapturedProgram
from plait.ir import TensorType, Value

FORMAT = "plait.specialization/2"  # NOTE: 2: the weights digest is taken per tensor


class CacheWarning(PlaitWarning):
    """A cache entry was discarded (corrupt or stale) and rebuilt, or could not be saved."""


class NotCacheable(Exception):
    """This specialization cannot have a cache key (the reason says why)."""


class CompileRequestLike(Protocol):
    """What the cache reads of a compile request (``plait.backends.CompileRequest``)."""

    @property
    def program(self) -> CapturedProgram: ...
    @property
    def backend(self) -> str: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def state(self) -> Sequence[torch.Tensor]: ...
    @property
    def store(self) -> Store | None: ...


class ManifestLike(Protocol):
    """What the cache reads and writes of a specialization's manifest (``plait.manifest``)."""

    options: dict[str, Any]
    cache: dict[str, Any]
    cache_key: dict[str, Any]
    timings: dict[str, float]
    graph: dict[str, Any]


class CompiledLike(Protocol):
    """What the cache reads of a compile's result (``plait.backends.Compiled``): the graph and
    the backend's program it saves, the manifest it fills in."""

    @property
    def manifest(self) -> Any: ...
    @property
    def graph(self) -> Any: ...
    @property
    def program(self) -> Any: ...


Req = TypeVar("Req", bound=CompileRequestLike)
Man = TypeVar("Man", bound=ManifestLike)
Out = TypeVar("Out", bound=CompiledLike)


def freeze_candidates(
    inputs: Sequence[Value], written: Set[str], slots: Mapping[str, int], pipeline: str
) -> list[str]:
    """The parameters and buffers the freeze pass of ``pipeline`` would make constants: state
    inputs the program does not write (``written``:
    :meth:`~plait.frontend.CapturedProgram.written_inputs`). NOTE: a superset of what it
    freezes; a compile that froze anything else is not saved."""
    if "freeze" not in [n.strip() for n in pipeline.split(",")]:
        return []
    return [
        v.name
        for v in inputs
        if v.kind in ("param", "buffer") and v.name in slots and v.name not in written
    ]


def _jsonable(value: Any, what: str) -> Any:
    def refuse(obj: Any) -> Any:
        raise NotCacheable(f"{what}: {type(obj).__name__} has no JSON form")

    return json.loads(json.dumps(value, sort_keys=True, default=refuse))


def toolchain_parts(
    backend: str, kernels: str | None = None, triton: bool = True
) -> dict[str, Any]:
    """The toolchain that made an entry: Python, PyTorch, plait (version and code digest); for
    Stax the C++ compiler (version and flags) and, where its kernels may be Triton's
    (``triton``), Triton; with TVM kernels (``backend="tvm"``, ``stax={"kernels": "tvm"}``:
    ``kernels="tvm"``) TVM's version and target."""
    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "plait": sys.modules["plait"].__version__,  # NOTE: the package this module is in
        # NOTE: the code itself, whose version string may stay while it changes
        "plait_code": _plait_code(),
    }
    if backend == "stax":
        from plait.codegen.build import toolchain

        # NOTE: the compiler by version and flags, never by its path on this machine.
        parts = dict(toolchain().key_parts())
        parts.pop("cxx", None)
        cpu = str(parts.pop("cpu_flags", ""))
        parts["cpu_flags_sha256"] = hashlib.sha256(cpu.encode()).hexdigest()
        out["cxx"] = parts
        if triton:
            from plait.runtime.program import triton_toolchain

            # NOTE: Triton kernels: the Triton and CUDA versions that compile them (reading
            # Triton's version costs about 1 ms: not for a program of C++ kernels only)
            out["triton"] = triton_toolchain()
        if kernels == "tvm":
            from plait.codegen.tvm_build import toolchain_record

            # NOTE: TVM's version and LLVM target (triple, CPU), its printer and schedules
            out["tvm"] = toolchain_record()
    return out


def _may_run_triton(req: CompileRequestLike, devices: Sequence[str]) -> bool:
    """Whether the request's Stax kernels may be Triton's: an input off the CPU, no tensor
    input at all (the program's own tensors may be anywhere), or a target the options name
    other than C++ (``stax={"target": "triton"}`` runs Triton on CPU tensors under its
    interpreter). A graph's tensors are on one device (Stax refuses others), so CPU inputs
    mean C++ kernels under the default target."""
    target = _stax_option(req, "target") or "auto"
    off_cpu = not devices or any(d != "cpu" for d in devices)
    return off_cpu or target not in ("auto", "cpu")


def _kernels(req: CompileRequestLike) -> str | None:
    """Which printer makes the request's Stax kernels, where the options name one."""
    return _stax_option(req, "kernels")


def _stax_option(req: CompileRequestLike, name: str) -> str | None:
    """The request's ``stax={name: ...}`` option as text, where it names one."""
    stax = req.options.get("stax") if isinstance(req.options, Mapping) else None
    value = stax.get(name) if isinstance(stax, Mapping) else None
    return None if value is None else str(value)


def _plait_code() -> str:
    try:
        return code_identity.plait_code_digest()
    except OSError as exc:  # NOTE: e.g. a file removed while the package is walked
        raise NotCacheable(f"plait's own code could not be identified ({exc})") from None


def key_parts(
    req: CompileRequestLike,
    options_record: Mapping[str, Any],
    pipeline: str,
    freeze: bool,
    ambient: Mapping[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """The key's parts and the freeze candidates; raises :class:`NotCacheable`. ``ambient``:
    the settings the compile depends on (:mod:`plait.guards.ambient`: call and process)."""
    prog = req.program
    if prog.semantic_hash is None or not prog.has_graph:
        raise NotCacheable("no graph")
    inputs = prog.interface()[0]
    try:
        guards = prog.guards.key_texts()
    except ValueError as exc:
        raise NotCacheable(f"a guard is specific to this process: {exc}") from None
    slots = {v.name: s.ref for v, s in zip(inputs, prog.inputs) if s.source == "state"}
    candidates = freeze_candidates(inputs, prog.written_inputs(), slots, pipeline) if freeze else []
    state: Sequence[torch.Tensor] = list(req.state)
    devices = sorted({v.type.device for v in inputs if isinstance(v.type, TensorType)})
    parts = {
        "format": FORMAT,
        "source": prog.semantic_hash,
        "guards": guards + [f"frozen|{n}" for n in candidates],
        "target": {"backend": req.backend, "devices": devices},
        "options": _jsonable(
            {**options_record, "pipeline": pipeline, "freeze": freeze}, "an option"
        ),
        "toolchain": toolchain_parts(
            req.backend, kernels=_kernels(req), triton=_may_run_triton(req, devices)
        ),
        "ambient": _jsonable(dict(ambient), "an ambient setting"),
        "weights": weights_digest({n: state[slots[n]] for n in candidates}),
    }
    return parts, candidates


@contextlib.contextmanager
def kernel_cache_events(events: list[str]) -> Iterator[None]:
    """``events`` gets what the kernel cache reported while the block ran (each was warned
    already, as :class:`~plait.codegen.build.KernelCacheWarning`): an entry discarded (damaged,
    or made for another key), a directory refused, a library that could not be kept."""
    first = len(build.EVENTS)
    try:
        yield
    finally:
        events.extend(f"kernel cache: {e}" for e in build.EVENTS[first:])


def _report(events: list[str], message: str) -> None:
    events.append(message)
    logs.emit("cache", "discarded", message)
    warn_at_caller(f"plait cache: {message}")


def _log(record: Mapping[str, Any]) -> None:
    """The ``cache`` channel: what one lookup found (the manifest's ``cache`` section)."""
    status = record.get("status", "?")
    key = str(record.get("key", ""))[:16]
    text = f"{status} {key}…" if key else str(status)
    if record.get("tier"):
        text += f" ({record['tier']} tier)"
    if record.get("miss"):
        text += f": {record['miss']}"
    elif status == "not cached":
        text += f": {'; '.join(record.get('events', []))}"
    logs.emit("cache", status.replace(" ", "_"), text, **dict(record))


def _internal(name: object) -> bool:
    return isinstance(name, str) and name.split(".")[0] in ("plait", "torch")


def warn_at_caller(message: str, category: type[Warning] = CacheWarning) -> None:
    """Warn, attributed to the innermost frame outside plait and PyTorch: the user's call,
    however many frames a hook or a wrapper puts between it and the cache. NOTE: never a frame
    in ``torch.*`` (a fixed stack level landed in ``torch.nn.Module._call_impl`` when a forward
    hook was set, where warning filters for PyTorch's own warnings then hid it)."""
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and _internal(frame.f_globals.get("__name__")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def cached_compile(
    req: Req,
    m: Man,
    pipeline: str,
    freeze: bool,
    needs_grad: bool,
    compile_fn: Callable[[Req, Man, str, bool, bool], Out],
    restore_fn: Callable[[Req, SavedCompile], Out],
    ambient: Mapping[str, Any],
) -> Out:
    """``restore_fn`` on a verified entry with this key, else ``compile_fn`` and save.
    ``compile_fn(req, m, pipeline, freeze, needs_grad)`` compiles and fills ``m`` in;
    ``restore_fn(req, saved)`` rebuilds a compile from a verified entry."""
    store = req.store
    if store is None:
        raise InternalValueError("cached_compile needs a request with a store")
    start = time.perf_counter()
    try:
        parts, candidates = key_parts(req, m.options, pipeline, freeze, ambient)
    except NotCacheable as exc:
        compiled = compile_fn(req, m, pipeline, freeze, needs_grad)
        compiled.manifest.cache = {"status": "not cached", "events": [str(exc)]}
        _log(compiled.manifest.cache)
        return compiled
    digest = CacheKey(parts).digest
    m.cache_key = {"digest": digest, "parts": parts}
    t_key = time.perf_counter() - start
    events: list[str] = []
    saved = None
    try:
        saved = load_compiled(store, digest)
    except CorruptEntryError as exc:
        _report(events, f"{exc}; rebuilt")
    except StaleEntryError as exc:
        with contextlib.suppress(OSError):  # NOTE: the rebuilt entry replaces it anyway
            store.delete(digest)
        _report(events, f"cache entry {digest[:16]}… discarded: {exc}; rebuilt")
    except OSError as exc:  # NOTE: an unusable cache directory costs the cache, not the compile
        _report(events, f"cache unavailable ({exc}); compiled without it")
        events += store.take_notes()
        with kernel_cache_events(events):
            compiled = compile_fn(req, m, pipeline, freeze, needs_grad)
        m.cache = {"status": "not cached", "key": digest, "events": events}
        _log(m.cache)
        return compiled
    problems: list[str] = getattr(store, "problems", [])  # NOTE: e.g. an index rebuilt
    for problem in problems[:]:
        problems.remove(problem)
        _report(events, problem)
    events += store.take_notes()  # NOTE: a remote tier's reads, outages (warned once)
    if saved is not None:
        # NOTE: the load rebuilt the program (here, or ahead of capture for an early run)
        events += [f"kernel cache: {e}" for e in saved.kernel_events]
        with kernel_cache_events(events):
            compiled = restore_fn(req, saved)
        compiled.manifest.cache_key = m.cache_key
        compiled.manifest.timings["cache.key"] = t_key
        compiled.manifest.cache = {"status": "hit", "key": digest, "events": events}
        tier = store.served_by(digest)
        if tier is not None:
            compiled.manifest.cache["tier"] = tier
        _log(compiled.manifest.cache)
        return compiled
    miss = explain_miss(parts, entry_parts(store))
    with kernel_cache_events(events):
        compiled = compile_fn(req, m, pipeline, freeze, needs_grad)
    m.timings["cache.key"] = t_key
    frozen = set(m.graph.get("frozen", []))
    if not frozen <= set(candidates):
        events.append(f"not saved: froze {sorted(frozen - set(candidates))}, not in the key")
    else:
        start = time.perf_counter()
        saved = SavedCompile(compiled.graph, m, _executor_kind(compiled), sorted(frozen))
        saved.program = compiled.program
        try:
            save_compiled(store, digest, parts, saved)
        except (OSError, ValueError, RuntimeError) as exc:
            _report(events, f"could not save entry {digest[:16]}…: {exc}")
        m.timings["cache.save"] = time.perf_counter() - start
        events += store.take_notes()  # NOTE: a remote tier's publish, or why it did not
    m.cache = {
        "status": "miss",
        "key": digest,
        "miss": str(miss),
        "differs": miss.differs,
        "events": events,
    }
    _log(m.cache)
    return compiled


def entry_parts(store: Store, limit: int | None = 256) -> list[tuple[str, Any]]:
    """The key parts of the most recently used artifact entries (read from their heads;
    snapshots have none), for :func:`~plait.cache.key.explain_miss`."""
    try:
        keys = [e.key for e in store.list()[:limit] if e.meta.get("kind") != "snapshot"]
    except OSError:
        return []
    out = []
    for key in keys:
        meta = store.read_meta(key)
        if meta is not None:
            out.append((key, meta.get("parts", {})))
    return out


def _executor_kind(compiled: CompiledLike) -> str:
    return "stax" if compiled.program is not None else "eager"

"""Regional compilation: a module whose call cannot be captured whole (``fullgraph=False``) runs
its own Python eagerly, and the calls it makes to its submodules go to compiled *regions*.

A :class:`RegionPlan` belongs to a module whose capture fell back. While that module runs
eagerly, each of its submodules has its ``forward`` replaced on the instance by a dispatch
(only for the duration of the call; another thread calling the same submodule meanwhile runs it
as written), so ``nn.Module.__call__`` runs the submodule's hooks eagerly, as written, and then
the dispatch. The first call of a submodule makes a *region engine* for it: a plait engine of its
own (guards, the gate's protocol, the manifest, the artifact cache) that captures the
submodule's forward. Hooks stay outside the region: their Python (a hook that collects outputs
in a list) runs on every call, never only at capture.
A submodule that captures whole is a region: its own submodules are never regions besides (the
largest region wins). One whose capture falls back gets a plan of its own and is split in turn,
recursively, down to modules that run eagerly because they have no capturable submodule.

Identical blocks (same classes, same parameter shapes and dtypes: the layers of a transformer)
share one capture and one compile: the program captured for the first is rebuilt for each other
with guards of its own (:func:`plait.snapshots.snapshot.program_from_doc`: it is shared only where
those guards hold), and the compiled artifact is reused as is. Such blocks keep their parameters
as graph inputs (``freeze`` off, unless requested): frozen weights would make each block's
artifact its own. :class:`RegionTree` holds the engines, the sharing tables and their counters.

What ``plait.explain`` reports of ops: the *compiled* ops of a call are the IR nodes of the
regions it ran compiled (as captured, opaque nodes apart), the *eager* ops are the ATen operators
that ran outside any compiled region (counted by a ``TorchDispatchMode``); both are measured on
the first call that runs the plan.

Example:
    >>> import torch, warnings, plait
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    ...     def forward(self, x):
    ...         return self.a(x) if x.sum() > 0 else self.b(x)  # a data-dependent branch
    >>> cm = plait.compile(Net(), backend="eager", options={"cache": False})
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     _ = cm(torch.ones(2, 4)), cm(-torch.ones(2, 4))
    >>> [(r["module"], r["status"]) for r in plait.explain(cm).regions["regions"]]
    [('a', 'compiled'), ('b', 'compiled')]
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from plait.cache.lookup import warn_at_caller
from plait.errors import CaptureFallbackWarning
from plait.frontend import CapturedProgram, GuardEnv
from plait.frontend.guard_plan import build_guards
from plait.frontend.pyvalues import Root, resolve

_LOCAL = threading.local()  # .active: the plans this thread runs, innermost last
_SLOT = "forward"  # NOTE: nn.Module._call_impl calls self.forward between its hooks
_ABSENT = object()  # NOTE: the slot was not in the instance dict (the class's forward showed)


def _active() -> list[RegionPlan]:
    active = getattr(_LOCAL, "active", None)
    if active is None:
        active = _LOCAL.active = []
    return active


def block_signature(module: nn.Module) -> tuple[Any, ...]:
    """What identical blocks have in common: the classes of the module tree by path, and each
    parameter's and buffer's path, dtype, shape, device and requires_grad. A lookup key only:
    a program is shared where its guards, rebuilt for the other block, hold."""
    subs = tuple((name, type(m)) for name, m in module.named_modules())
    tensors = [*module.named_parameters(), *module.named_buffers()]
    state = tuple(
        (name, type(t), t.dtype, tuple(t.shape), t.device, t.requires_grad) for name, t in tensors
    )
    return (type(module), subs, state)


class _OpCounter(TorchDispatchMode):
    """Counts the ATen operators that run eagerly, by the module whose Python runs them: the top
    of ``where`` (None: a region engine runs, nothing is counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str | None] = []
        self.eager: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.where and self.where[-1] is not None:
            self.eager[self.where[-1]] += 1
        return func(*args, **(kwargs or {}))


def _location(err: Exception | None) -> dict[str, Any]:
    if err is None:
        return {}
    return {
        "operation": getattr(err, "operation", None),
        "file": getattr(err, "filename", None),
        "line": getattr(err, "lineno", None),
    }


class RegionTree:
    """The region engines of one compiled module, by submodule, with what identical blocks
    share. ``make_engine(module, path, share)`` makes a region engine (``share``: whether the
    module has identical blocks in the tree). ``counts``: ``captures`` and ``compiles`` the
    region engines ran, ``programs_shared`` and ``artifacts_shared`` (captures and compiles a
    block took from an identical one instead)."""

    def __init__(
        self,
        root: nn.Module,
        make_engine: Callable[[nn.Module, str, bool], Any],
        root_engine: Any,
    ) -> None:
        self.root = root
        self.make_engine = make_engine
        self.root_engine = root_engine
        self.version = 0  # NOTE: bumped by each new engine or specialization in the tree
        self._reported = -1
        # NOTE: one thread at a time runs the module's Python with regions dispatched: the
        # dispatch slots are module attributes, and a capture must never see another call's.
        self.lock = threading.RLock()
        self.names: dict[int, str] = {}
        self.signature: dict[int, tuple[Any, ...]] = {}
        self.group_size: Counter[tuple[Any, ...]] = Counter()
        self._index()
        self.engines: dict[int, Any] = {}
        self.order: list[Any] = []  # region engines in the order they were made
        self.programs: dict[tuple[Any, ...], list[CapturedProgram]] = {}
        self.artifacts: dict[tuple[Any, ...], Any] = {}
        self.counts: Counter[str] = Counter()
        self.unshared: dict[str, str] = {}  # module path -> why its program is its own
        self.counter: _OpCounter | None = None
        self.measured: dict[str, Any] | None = None
        self.compiled_ops: Counter[str] = Counter()
        self.opaque_ops: Counter[str] = Counter()

    def _index(self) -> None:
        """Paths and block signatures of the module tree (again after a submodule was
        replaced: a recompile of the root says so)."""
        self.names = {id(m): name for name, m in self.root.named_modules()}
        self.signature = {id(m): block_signature(m) for m in self.root.modules()}
        self.group_size = Counter(self.signature.values())

    def warn(self, message: str) -> None:
        """A region's warning, attributed where the compiled module's own warnings are: the
        frame that called it (two above its engine's call); the innermost frame outside plait
        and PyTorch when that call is not on the stack."""
        frame, level = sys._getframe(1), 1
        while frame is not None:
            if frame.f_code.co_name == "__call__" and frame.f_locals.get("self") is (
                self.root_engine
            ):
                warnings.warn(message, CaptureFallbackWarning, stacklevel=level + 3)
                return
            frame, level = frame.f_back, level + 1  # type: ignore[assignment]
        warn_at_caller(message, CaptureFallbackWarning)

    def path_of(self, module: nn.Module) -> str:
        return self.names.get(id(module), f"<{type(module).__name__} outside the module>")

    def shared(self, module: nn.Module) -> bool:
        sig = self.signature.get(id(module))
        return sig is not None and self.group_size[sig] > 1

    def engine_for(self, module: nn.Module) -> Any:
        engine = self.engines.get(id(module))
        if engine is None:
            if id(module) not in self.names:
                self._index()
            engine = self.make_engine(module, self.path_of(module), self.shared(module))
            self.engines[id(module)] = engine
            self.order.append(engine)
            self.version += 1
        return engine

    # --- sharing between identical blocks -------------------------------------------------
    def shared_program(
        self, engine: Any, env: GuardEnv, paths: list[str]
    ) -> CapturedProgram | None:
        """A program an identical block captured, rebuilt for this block's call and guarded
        for it; None when there is none whose guards hold here."""
        sig = self.signature.get(id(engine.fn))
        for first in self.programs.get(sig, []) if sig is not None else []:
            try:
                prog = _rebound(first, engine, env, paths)
            except LookupError as exc:
                self.unshared[engine.path] = str(exc)
                continue
            self.counts["programs_shared"] += 1
            return prog
        return None

    def publish_program(self, engine: Any, prog: CapturedProgram) -> None:
        if not self.shared(engine.fn) or not prog.has_graph or prog.guard_plan is None:
            return
        self.programs.setdefault(self.signature[id(engine.fn)], []).append(prog)

    @staticmethod
    def _artifact_key(prog: CapturedProgram, settings: Any) -> tuple[Any, ...] | None:
        try:
            guards = tuple(prog.guards.key_texts())
        except ValueError:
            return None
        names = tuple(v.name for v in prog.interface()[0])  # NOTE: the executor binds by name
        return (prog.semantic_hash, names, guards, repr(sorted(settings.items())))

    def shared_artifact(self, engine: Any, prog: CapturedProgram, settings: Any) -> Any:
        """The compiled artifact an identical block made of the same program, if any."""
        if not self.shared(engine.fn) or prog.semantic_hash is None:
            return None
        key = self._artifact_key(prog, settings)
        return self.artifacts.get(key) if key is not None else None

    def publish_artifact(
        self, engine: Any, prog: CapturedProgram, settings: Any, compiled: Any
    ) -> None:
        """NOTE: an artifact with frozen parameters is this block's own (its weights are in it)."""
        if not self.shared(engine.fn) or compiled.executor is None:
            return
        if compiled.manifest.graph.get("frozen"):
            self.unshared[engine.path] = "its compile froze parameters (freeze=True)"
            return
        key = self._artifact_key(prog, settings)
        if key is not None:
            self.artifacts.setdefault(key, compiled)

    # --- op counts --------------------------------------------------------------------------
    def note_compiled(self, path: str, prog: CapturedProgram) -> None:
        """A region ran compiled: count its IR nodes while a measurement runs."""
        graph = prog.graph if self.counter is not None else None
        if graph is None:
            return
        opaque = sum(1 for n in graph.nodes if n.op == "opaque")
        self.compiled_ops[path] += len(graph.nodes) - opaque
        self.opaque_ops[path] += opaque

    @contextlib.contextmanager
    def counting(self, path: str | None) -> Iterator[None]:
        """While a measurement runs, the ATen ops of the block count for module ``path``
        (eagerly run Python), or not at all (None: a region engine runs)."""
        counter = self.counter
        if counter is None:
            yield
            return
        counter.where.append(path)
        try:
            yield
        finally:
            counter.where.pop()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """The first call that runs the root's plan counts its ops (see the module doc)."""
        if self.measured is not None or self.counter is not None:
            yield
            return
        counter = _OpCounter()
        self.counter = counter
        self.compiled_ops.clear()
        self.opaque_ops.clear()
        ok = False
        try:
            with counter:
                yield
            ok = True
        finally:
            self.counter = None
            if ok:
                self.measured = {
                    "eager": dict(counter.eager),
                    "compiled": dict(self.compiled_ops),
                    "opaque": dict(self.opaque_ops),
                }

    # --- the report -------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Regions, boundaries, op shares and sharing counts, as JSON values."""
        root_engine = self.root_engine
        measured = self.measured or {"eager": {}, "compiled": {}, "opaque": {}}
        artifact_users: dict[int, list[str]] = {}
        for e in self.order:
            for s in e.specializations:
                if s.executor is not None:
                    artifact_users.setdefault(id(s.compiled), []).append(e.path)
        regions: list[dict[str, Any]] = []
        boundaries: list[dict[str, Any]] = []
        for e in [root_engine, *self.order]:
            for s in e.specializations:
                if s.executor is None and s.fallback_reason is not None:
                    boundaries.append(
                        {
                            "module": e.path,
                            "class": type(e.fn).__name__,
                            "reason": s.fallback_reason,
                            **_location(s.program.fallback_error),
                        }
                    )
            for why in (e.refused, e.hooked, (e.limit_fallback or {}).get("reason")):
                if why is not None:
                    boundaries.append(
                        {"module": e.path, "class": type(e.fn).__name__, "reason": why}
                    )
            if e is root_engine:
                continue
            compiled = [s for s in e.specializations if s.executor is not None]
            split = e.regions is not None
            status = "compiled" if compiled else "split" if split else "eager"
            others = sorted(
                {p for s in compiled for p in artifact_users.get(id(s.compiled), ())} - {e.path}
            )
            backends = sorted({s.manifest.executor.get("backend", "?") for s in compiled})
            regions.append(
                {
                    "module": e.path,
                    "class": type(e.fn).__name__,
                    "status": status,
                    "backends": backends,
                    "specializations": len(e.specializations),
                    "shares_artifact_with": others,
                    "not_shared": self.unshared.get(e.path),
                    "compiled_ops": measured["compiled"].get(e.path, 0),
                    "opaque_ops": measured["opaque"].get(e.path, 0),
                    "eager_ops": measured["eager"].get(e.path, 0),
                }
            )
        total_c = sum(measured["compiled"].values())
        total_o = sum(measured["opaque"].values())
        total_e = sum(measured["eager"].values())
        total = total_c + total_o + total_e
        return {
            "regions": regions,
            "boundaries": boundaries,
            "ops": {
                "measured": self.measured is not None,
                "compiled": total_c,
                "opaque": total_o,
                "eager": total_e,
                "eager_in_root": measured["eager"].get(root_engine.path, 0),
                "compiled_share": (total_c / total) if total else None,
            },
            "sharing": dict(self.counts),
        }

    def refresh_manifests(self) -> None:
        """The manifest of each specialization that runs split says so and lists its regions
        and boundaries (those under its module)."""
        if self._reported == self.version:
            return
        self._reported = self.version
        report = self.report()
        for e in [self.root_engine, *self.order]:
            if e.regions is None:
                continue
            prefix = f"{e.path}." if e.path else ""
            mine = [r for r in report["regions"] if r["module"].startswith(prefix)]
            section = {
                "backend": "regional",
                "regions": [
                    {k: r[k] for k in ("module", "class", "status", "backends")} for r in mine
                ],
                "boundaries": [
                    {k: b.get(k) for k in ("module", "class", "operation", "file", "line")}
                    | {"reason": str(b["reason"]).splitlines()[0]}
                    for b in report["boundaries"]
                    if b["module"] == e.path or b["module"].startswith(prefix)
                ],
            }
            for s in e.specializations:
                if s.executor is None:
                    s.manifest.executor = section


def _rebound(
    first: CapturedProgram, engine: Any, env: GuardEnv, paths: list[str]
) -> CapturedProgram:
    """``first`` (a program an identical block captured) guarded for ``engine``'s block and
    this call; raises ``LookupError`` saying why it does not apply. Each place the program read
    relative to the block (its attributes, hooks, class, training flags) is read again on this
    block; the others (globals, functions, objects outside the block) are the same places."""
    plan = copy.copy(first.guard_plan)
    descs = [r.desc for r in plan.pyroots] if plan.pyroots is not None else plan.pyreads
    olds: list[Root | None] = (
        list(plan.pyroots) if plan.pyroots is not None else [None] * len(descs)
    )
    roots = []
    for old, desc in zip(olds, descs):
        if desc is None:
            assert old is not None
            roots.append(old)
            continue
        root = resolve(desc, engine.fn)
        if old is not None:
            root.names = old.names  # NOTE: the attributes its code names of a user object
        roots.append(root)
    plan.pyroots = roots
    try:
        guards = build_guards(plan, env.spec, env.leaves, paths, engine.state, env.state)
    except Exception as exc:  # NOTE: e.g. an input aliasing another: capture says it best
        raise LookupError(f"the guards do not apply to this block ({exc})") from None
    prog = copy.copy(first)
    prog.guards, prog.guard_plan = guards, plan
    if not _same_expectations(prog, first):
        raise LookupError(
            "its call reads other values than an identical block's (Python attributes, hooks, "
            "training flags, argument types)"
        )
    if not guards.holds(GuardEnv(env.spec, env.leaves, engine.fn, env.state)):
        raise LookupError("its call fails the guards of an identical block's program")
    return prog


def _same_expectations(prog: CapturedProgram, first: CapturedProgram) -> bool:
    """Whether the guards rebuilt for another block expect, one by one, what the first block's
    guards expected at its capture. NOTE: a rebuilt guard takes its expected value from the
    block at hand (its attributes, hooks, training flags); the key texts name what is read, not
    always its value, so equal key texts alone would share a program across different values."""
    mine, theirs = prog.guards.guards, first.guards.guards
    if len(mine) != len(theirs):
        return False
    try:
        return all(
            (a.kind, a.text) == (b.kind, b.text) and bool(a.expected == b.expected)
            for a, b in zip(mine, theirs)
        )
    except Exception:  # NOTE: a value that does not compare: not shared
        return False


class RegionPlan:
    """One module split into regions: while it runs eagerly (:meth:`run`), the calls its Python
    makes to its submodules go to their region engines."""

    def __init__(self, tree: RegionTree, module: nn.Module, path: str) -> None:
        self.tree = tree
        self.module = module
        self.path = path

    def _dispatcher(self, module: nn.Module, prev: Any) -> Callable[..., Any]:
        original = _bound_forward(module, prev)

        def dispatch(*args: Any, **kwargs: Any) -> Any:
            if self not in _active():  # NOTE: another thread: the module as written
                return original(*args, **kwargs)
            return self._call_region(module, args, kwargs)

        dispatch._plait_region = True  # type: ignore[attr-defined]
        dispatch._plait_original = prev  # type: ignore[attr-defined]
        return dispatch

    def run(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """``call(*args, **kwargs)``: the module's Python, eagerly, with regions dispatched."""
        tree = self.tree
        with tree.lock:
            measure = tree.measuring() if self.module is tree.root else contextlib.nullcontext()
            with measure:
                installed = self._install()
                active = _active()
                active.append(self)
                try:
                    with tree.counting(self.path):
                        out = call(*args, **kwargs)
                finally:
                    active.pop()
                    _restore(installed)
            if self.module is tree.root:
                tree.refresh_manifests()
            return out

    def _install(self) -> list[tuple[nn.Module, Any]]:
        """Every submodule (at any depth) dispatches its forward to its region while the
        module runs: ``nn.Module.__call__`` runs the hooks, eagerly, then ``self.forward``."""
        installed = []
        for m in self.module.modules():
            if m is self.module or getattr(m, "_compiled_call_impl", None) is not None:
                continue  # NOTE: one the user compiled (Module.compile) keeps its own
            prev = m.__dict__.get(_SLOT, _ABSENT)
            if getattr(prev, "_plait_region", False):
                continue  # NOTE: another thread's plan cannot be running (the tree's lock)
            installed.append((m, prev))
            m.__dict__[_SLOT] = self._dispatcher(m, prev)
        return installed

    def _call_region(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        tree = self.tree
        engine = tree.engine_for(module)
        # NOTE: the region's capture and guards must see its submodules as written: the
        # dispatch slots of this and enclosing plans are taken out below it while it runs.
        hooked = _hooked_below(module)
        if hooked is not None:
            # NOTE: a hook's Python must run on each call: the module is split instead, so
            # that the hooked submodule is a region of its own with its hooks run eagerly
            return engine.split_call(args, kwargs, hooked)
        hidden = _hide_below(module)
        try:
            with tree.counting(None):
                return engine.region_call(args, kwargs)
        finally:
            _restore(hidden)


# NOTE: arguments a region's guards compare by value; any other object is compared by identity
_VALUES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def object_argument(leaves: list[Any], paths: list[str]) -> str | None:
    """Why a region call cannot be compiled: an argument that is an object (a key-value cache,
    a config) its Python may change (``cache.update(...)``), which a compiled call would not;
    None when every argument is a tensor or a plain value."""
    for leaf, path in zip(leaves, paths):
        if not isinstance(leaf, (torch.Tensor, *_VALUES)):
            return (
                f"its call passes {path}, a {type(leaf).__name__} object (its Python may change "
                "it on each call), so it runs split"
            )
    return None


def _hooked_below(module: nn.Module) -> str | None:
    """Why ``module`` cannot be one region now: a submodule with hooks (they would run only at
    capture inside a region); None when there is none."""
    for name, m in module.named_modules():
        if m is module:
            continue
        for table in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks"):
            if m.__dict__.get(table):
                return f"its submodule {name} has hooks (they run eagerly, on each call)"
        if m.__dict__.get("_backward_hooks"):
            return f"its submodule {name} has hooks (they run eagerly, on each call)"
    return None


def _bound_forward(module: nn.Module, prev: Any) -> Callable[..., Any]:
    """The forward ``module`` had before a dispatch slot replaced it: its own (an instance
    attribute) or its class's."""
    if prev is _ABSENT:
        return type(module).forward.__get__(module)
    return prev


def call_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module``'s own forward (never a dispatch slot): what a region engine captures and
    runs eagerly. Its hooks ran already, eagerly, in ``nn.Module.__call__``."""
    slot = module.__dict__.get(_SLOT, _ABSENT)
    if getattr(slot, "_plait_region", False):
        slot = slot._plait_original
    return _bound_forward(module, slot)(*args, **kwargs)


def _hide_below(module: nn.Module) -> list[tuple[nn.Module, Any]]:
    hidden = []
    for m in module.modules():
        if m is module:
            continue
        slot = m.__dict__.get(_SLOT)
        if slot is not None and getattr(slot, "_plait_region", False):
            hidden.append((m, slot))
            if slot._plait_original is _ABSENT:
                del m.__dict__[_SLOT]
            else:
                m.__dict__[_SLOT] = slot._plait_original
    return hidden


def _restore(saved: list[tuple[nn.Module, Any]]) -> None:
    """Each slot as it was: the instance dict's own key removed where it had none, so that the
    module reads as it did at capture."""
    for m, value in reversed(saved):
        if value is _ABSENT:
            m.__dict__.pop(_SLOT, None)
        else:
            m.__dict__[_SLOT] = value


def can_split(module: Any, prog: CapturedProgram) -> bool:
    """Whether a fallback of ``module``'s call is split into regions: a module with submodules
    whose capture fell back for a reason a submodule's capture may not share (not autocast)."""
    if not isinstance(module, nn.Module) or prog.has_graph:
        return False
    err = prog.fallback_error
    if getattr(err, "operation", None) == "torch.autocast":
        return False
    return any(True for _ in module.children())


__all__ = [
    "RegionPlan",
    "RegionTree",
    "block_signature",
    "call_forward",
    "can_split",
    "object_argument",
]

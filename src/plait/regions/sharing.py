"""What identical blocks share (the layers of a transformer: same classes, same parameter shapes
and dtypes): one capture, rebuilt for each other block with guards of its own
(:func:`_rebound`), and one compiled artifact, reused as is.

NOTE: a program is shared only where its guards, rebuilt for the other block, hold and expect
what the first block's expected; an artifact whose compile froze parameters is never shared
(its weights are in it).
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

from torch import nn

from plait.errors import UnknownNameError
from plait.frontend import CapturedProgram
from plait.frontend.guard_plan import build_guards, const_slots
from plait.frontend.pyvalues import Root
from plait.frontend.saved_roots import resolve
from plait.guards import GuardEnv
from plait.guards.ambient import global_hooks


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


class BlockSharing:
    """The programs and artifacts identical blocks of one module tree share, by block signature.
    ``counts``: ``programs_shared`` and ``artifacts_shared`` (captures and compiles a block took
    from an identical one instead); ``unshared``: module path -> why its program is its own."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.names: dict[int, str] = {}
        self.signature: dict[int, tuple[Any, ...]] = {}
        self.group_size: Counter[tuple[Any, ...]] = Counter()
        self._index()
        # NOTE: each with the global module hooks its capture ran (they are in its graph, and
        # no guard of the program reads them: the compile adds that guard, for the hooks then)
        # and the engine that captured it
        self.programs: dict[tuple[Any, ...], list[tuple[CapturedProgram, Any, Any]]] = {}
        self.artifacts: dict[tuple[Any, ...], Any] = {}
        self.counts: Counter[str] = Counter()
        self.unshared: dict[str, str] = {}  # module path -> why its program is its own

    def _index(self) -> None:
        """Paths and block signatures of the module tree (again after a submodule was
        replaced: a recompile of the root says so)."""
        self.names = {id(m): name for name, m in self.root.named_modules()}
        self.signature = {id(m): block_signature(m) for m in self.root.modules()}
        self.group_size = Counter(self.signature.values())

    def shared(self, module: nn.Module) -> bool:
        sig = self.signature.get(id(module))
        return sig is not None and self.group_size[sig] > 1

    def shared_program(
        self, engine: Any, env: GuardEnv, paths: list[str]
    ) -> CapturedProgram | None:
        """A program an identical block captured, rebuilt for this block's call and guarded
        for it; None when there is none whose guards hold here."""
        sig = self.signature.get(id(engine.fn))
        why = None
        for first, hooks, owner in self.programs.get(sig, []) if sig is not None else []:
            if owner is engine:
                continue  # NOTE: its own earlier program: its guards failed already
            if hooks != global_hooks():
                why = "the global module hooks are not its capture's"
                continue
            try:
                prog = _rebound(first, engine, env, paths)
            except LookupError as exc:
                why = str(exc)
                continue
            self.counts["programs_shared"] += 1
            self.unshared.pop(engine.path, None)
            return prog
        # NOTE: why its latest program is its own (None: no identical block captured one)
        if why is None:
            self.unshared.pop(engine.path, None)
        else:
            self.unshared[engine.path] = why
        return None

    def publish_program(self, engine: Any, prog: CapturedProgram) -> None:
        if not self.shared(engine.fn) or not prog.has_graph or prog.guard_plan is None:
            return
        programs = self.programs.setdefault(self.signature[id(engine.fn)], [])
        programs.append((prog, global_hooks(), engine))

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
        consts = [s.ref for s in const_slots(first.inputs)]
        guards = build_guards(
            plan, env.spec, env.leaves, paths, engine.state, env.state, consts=consts
        )
    except Exception as exc:  # NOTE: e.g. an input aliasing another: capture says it best
        raise UnknownNameError(f"the guards do not apply to this block ({exc})") from None
    prog = copy.copy(first)
    prog.guards, prog.guard_plan = guards, plan
    if not _same_expectations(prog, first):
        raise UnknownNameError(
            "its call reads other values than an identical block's (Python attributes, hooks, "
            "training flags, argument types)"
        )
    if not guards.holds(GuardEnv(env.spec, env.leaves, engine.fn, env.state)):
        raise UnknownNameError("its call fails the guards of an identical block's program")
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

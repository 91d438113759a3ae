"""A specialization's guards as data: what capture learned, apart from the call it saw.

Capture fills a :class:`GuardPlan` (the input types it traced, the size comparisons the program
made, the symbols of dynamic dims, whether it wrote an input, which parameters it read, where it
read a layout); :func:`build_guards` turns a plan and a call into the guard set. Capture builds
its guards that way, and a warm start rebuilds them from a saved plan (:meth:`GuardPlan.to_json`)
and the call at hand, without capturing: the guards' cache-key texts then say whether that call
is one the plan was made for.

Example:
    >>> import torch
    >>> from plait.frontend import InputAdapter, capture_program
    >>> f = lambda x: x.relu() if x.shape[0] > 2 else x
    >>> x = torch.randn(4, 8)
    >>> prog = capture_program(f, (x,))
    >>> plan = GuardPlan.from_json(prog.guard_plan.to_json())
    >>> spec, leaves, paths = InputAdapter(f).flatten((x,), {})
    >>> build_guards(plan, spec, leaves, paths).key_texts() == prog.guards.key_texts()
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import sympy
import torch

from plait.errors import GraphCaptureError, NotSavableError
from plait.frontend import (
    guard_build,
    identity_guard,
    pyvalues,
    saved_roots,
    size_guards,
    tensor_attr_writes,
)
from plait.frontend.output_views import FORMAT_READ
from plait.frontend.state import ModuleState
from plait.guards.guard import Guard, GuardSet
from plait.ir import TensorType
from plait.ir.parser import parse_type
from plait.ir.text import format_type
from plait.symbolic.dims import parse_dim, symbol

if TYPE_CHECKING:
    from plait.frontend.capture_values import Lift
    from plait.frontend.program import InputSlot
    from plait.frontend.tracer import CaptureContext

_RELATIONS = {">": sympy.Gt, ">=": sympy.Ge, "<": sympy.Lt, "<=": sympy.Le, "==": sympy.Eq}


@dataclass
class GuardPlan:
    """What the guards of a specialization depend on besides the call (see the module doc)."""

    user_types: dict[int, TensorType] = field(default_factory=dict)
    predicates: list[tuple[Any, bool]] = field(default_factory=list)  # (relation, outcome)
    symbols: dict[Any, tuple[int, int, str]] = field(default_factory=dict)  # sym -> leaf, dim, src
    bindings: dict[Any, int] = field(default_factory=dict)  # dynamic symbols -> capture size
    duck: list[tuple[int, int, str, Any]] = field(default_factory=list)
    dynamic: bool = False
    # NOTE: the program writes an input (a user tensor, a parameter or a buffer): the tensors it
    # reads (user inputs and the state it uses) must not share memory, or one would read another's
    # value from before the write
    alias: bool = False
    # NOTE: the tensors it writes, as ("user", leaf), ("state", entry) or ("const", k: the k-th
    # constant input): none may overlap itself (eager's write would read what the same call
    # wrote, in its order of visits), and no constant may share memory with one written
    # (the graph reads a constant as a tensor of its own)
    written: list[tuple[str, int]] = field(default_factory=list)
    used: list[int] | None = None  # state entries the graph reads (None: all)
    layout_read: str | None = None
    # NOTE: the Python values the program read (plait.frontend.pyreads): the live roots at
    # capture; a warm start finds them again from their saved descriptions
    pyroots: list[Any] | None = field(default=None, compare=False, repr=False)
    pyreads: list[list[Any]] = field(default_factory=list)
    # NOTE: every constant tensor the program read of its environment, its metadata alone too
    # (``T.shape[0]``, no graph input): its type is guarded (guard_build.const_guard); plait's
    # own constants (a torch.tensor call's, an ATen graph's) are fixed; None: the constant inputs'
    read_consts: list[Any] | None = field(default=None, compare=False, repr=False)
    # NOTE: (leaf, name): a Python attribute the program looked for on an input tensor that
    # lacked it (getattr with a default, hasattr): later calls' tensors must lack it too
    input_attrs: list[tuple[int, str]] = field(default_factory=list)
    # NOTE: the tensors whose Python attributes the program sets, as ("user", leaf), ("state",
    # entry) or ("const", tensor): each is no other tensor of the call (tensor_attr_writes)
    attr_targets: list[tuple[str, Any]] = field(default_factory=list, compare=False, repr=False)
    # NOTE: (leaf, first): an input tensor that was the same object as an earlier leaf at
    # capture (traced as one): later calls pass the same pattern of identical tensors
    same: list[tuple[int, int]] = field(default_factory=list)
    # NOTE: (leaf, entry): an input tensor that was the module's state entry at capture (traced
    # as that parameter or buffer): later calls pass it again, and no other input is state
    in_state: list[tuple[int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON form; raises ``ValueError`` for a relation it cannot write, or where the
        program sets Python attributes of tensors (set again by the program capture made)."""
        if self.attr_targets:
            raise NotSavableError("the program sets Python attributes of tensors")
        preds = []
        for rel, outcome in self.predicates:
            op = getattr(rel, "rel_op", None)
            if op not in _RELATIONS:
                raise NotSavableError(f"a size comparison {rel} has no saved form")
            preds.append([op, str(rel.lhs), str(rel.rhs), bool(outcome)])
        return {
            "user_types": {str(i): format_type(t) for i, t in self.user_types.items()},
            "predicates": preds,
            "symbols": [[str(s), i, d, src] for s, (i, d, src) in self.symbols.items()],
            "bindings": [[str(s), n] for s, n in self.bindings.items()],
            "duck": [[j, e, src, str(s)] for j, e, src, s in self.duck],
            "dynamic": self.dynamic,
            "alias": self.alias,
            "written": [list(w) for w in self.written],
            "used": self.used,
            "layout_read": self.layout_read,
            "input_attrs": [list(a) for a in self.input_attrs],
            "same": [list(p) for p in self.same],
            "in_state": [list(p) for p in self.in_state],
            "pyreads": pyvalues.saved_form(self.pyroots) if self.pyroots else self.pyreads,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GuardPlan:
        types = {}
        for i, text in doc["user_types"].items():
            t = parse_type(text)
            assert isinstance(t, TensorType)
            types[int(i)] = t
        return cls(
            user_types=types,
            predicates=[
                (_RELATIONS[op](parse_dim(lhs), parse_dim(rhs), evaluate=False), outcome)
                for op, lhs, rhs, outcome in doc["predicates"]
            ],
            symbols={symbol(s): (i, d, src) for s, i, d, src in doc["symbols"]},
            bindings={symbol(s): n for s, n in doc["bindings"]},
            duck=[(j, e, src, symbol(s)) for j, e, src, s in doc["duck"]],
            dynamic=doc["dynamic"],
            alias=doc["alias"],
            written=[(str(where), int(i)) for where, i in doc.get("written", [])],
            used=doc["used"],
            layout_read=doc["layout_read"],
            input_attrs=[(int(i), str(n)) for i, n in doc.get("input_attrs", [])],
            same=[(int(i), int(j)) for i, j in doc.get("same", [])],
            in_state=[(int(i), int(k)) for i, k in doc.get("in_state", [])],
            pyreads=[list(d) for d in doc["pyreads"]],
        )


def plan_of(
    cx: CaptureContext,
    ms: ModuleState | None,
    slots: list[InputSlot] | None,
    mutations: list[tuple[Lift, int]],
) -> GuardPlan:
    """A capture's plan: what the guards depend on besides the call (the call's own values
    come at build); ``slots``: the graph's inputs (None: a fallback's)."""
    used = None
    if ms is not None and slots is not None:
        used = sorted(s.ref for s in slots if s.source == "state")
    return GuardPlan(
        user_types={lift.ref: lift.type for lift in cx.lifts if lift.kind == "user"},
        predicates=list(cx.predicates.values()),
        symbols=dict(cx.symbols),
        bindings=dict(cx.bindings),
        duck=list(cx.duck),
        dynamic=cx.dynamic,
        alias=bool(mutations),
        written=_written(mutations, slots),
        used=used,
        layout_read=cx.layout_read if cx.layout_read is not None else cx.format_read,
        input_attrs=sorted(cx.absent_attrs),
        same=list(cx.same_leaves),
        in_state=list(cx.state_leaves),
        read_consts=None
        if slots is None
        else [lift.ref for lift in cx.lifts if lift.kind == "const" and lift.origin is not None],
    )


def _written(mutations: list[tuple[Lift, int]], slots: list[InputSlot] | None) -> list:
    """The plan's ``written``: each written input as ("user", leaf), ("state", entry) or
    ("const", k), k its position among the constant inputs."""
    consts = {id(s.ref): k for k, s in enumerate(const_slots(slots or []))}
    out: list[tuple[str, int]] = []
    for lift, _ in mutations:
        if lift.kind in ("user", "param", "buffer"):
            out.append(("user" if lift.kind == "user" else "state", lift.ref))
        elif lift.kind == "const" and id(lift.ref) in consts:
            out.append(("const", consts[id(lift.ref)]))
    return out


def const_slots(slots: Sequence[InputSlot]) -> list[InputSlot]:
    """The constant inputs among a program's input slots, in order (a tensor each)."""
    return [s for s in slots if s.source == "const" and isinstance(s.ref, torch.Tensor)]


def build_guards(
    plan: GuardPlan,
    spec: Any,
    leaves: Sequence[Any],
    paths: Sequence[str],
    ms: ModuleState | None = None,
    state: Sequence[torch.Tensor] = (),
    pykeys: Sequence[pyvalues.Keyed] | None = None,
    consts: Sequence[torch.Tensor] = (),
) -> GuardSet:
    """The guard set of ``plan`` for the call ``(spec, leaves)`` and the module state.
    ``pykeys``: the plan's Python roots each read just now (capture's, in their order);
    ``consts``: the program's constant inputs, in slot order (:func:`const_slots`)."""
    guards: list[Guard] = [guard_build.structure_guard(spec, leaves, paths)]
    tensor_leaves = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    state_paths = [e.path for e in ms.entries] if ms is not None else []
    read_consts = consts if plan.read_consts is None else plan.read_consts
    roots = plan.pyroots
    if roots is None:
        module = ms.module if ms is not None else None
        roots = [saved_roots.resolve(d, module) for d in plan.pyreads]
        pykeys = None
    keys = list(pykeys) if pykeys is not None else [pyvalues.keyed(r) for r in roots]
    held = identity_guard.held_tensors(read_consts, [k.key for k in keys])
    identity_guard.refuse_held_inputs(tensor_leaves, leaves, paths, held)
    if len(tensor_leaves) > 1 or (tensor_leaves and (state_paths or held)):
        guards.append(
            identity_guard.identity_guard(
                tensor_leaves, plan.same, paths, plan.in_state, state_paths, held
            )
        )
    for i, (leaf, path) in enumerate(zip(leaves, paths)):
        if isinstance(leaf, torch.Tensor):
            ty = plan.user_types.get(i) or TensorType.of(leaf)
            guards += guard_build.tensor_guards(i, path, leaf, ty)
        else:
            guards.append(guard_build.scalar_guard(i, path, leaf))
    for pred in size_guards.simplified(plan.predicates, set(plan.bindings)):
        redundant = not any(s in plan.bindings for s in pred[0].free_symbols)
        guards += guard_build.predicate_guards([pred], plan.symbols, redundant)
    if plan.dynamic:
        guards += guard_build.symbol_guards(plan.symbols, plan.bindings, plan.duck)
    used: list[int] = []
    if ms is not None:
        used = list(plan.used) if plan.used is not None else list(range(len(ms.entries)))
    if plan.alias:
        live_state = state or (ms.fetch() if ms is not None else [])
        traced_as_other = {i for i, _ in [*plan.same, *plan.in_state]}
        guards.append(
            _no_alias_guard(leaves, used, live_state, plan.written, consts, traced_as_other)
        )
    guards += guard_build.ambient_guards()
    guards += guard_build.const_guard(read_consts)
    if ms is not None:
        guards += guard_build.module_guards(ms, used, state or ms.fetch())
    if plan.layout_read is not None:
        live = state or (ms.fetch() if ms is not None else [])
        guards.append(
            guard_build.layout_guard(
                plan.layout_read,
                leaves,
                paths,
                used,
                live,
                symbolic=bool(plan.bindings),
                source="memory format" if plan.layout_read == FORMAT_READ else "strides",
            )
        )
    if plan.input_attrs:
        guards.append(guard_build.input_attrs_guard(plan.input_attrs, paths))
    if plan.attr_targets:
        live = state or (ms.fetch() if ms is not None else [])
        held = plan.read_consts or []
        guards.append(tensor_attr_writes.distinct_guard(plan.attr_targets, leaves, live, held))
    guards += pyvalues.python_values_guards(roots, keys)
    return GuardSet(guards)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of ``t``'s storage, as [start, end) addresses (NOTE: storages of their own may
    share memory: ``torch.from_numpy`` of two overlapping slices of one array)."""
    storage = t.untyped_storage()
    start = int(storage.data_ptr())
    return start, start + int(storage.nbytes())


def _distinct_memory(tensors: list[torch.Tensor]) -> bool:
    spans = sorted(s for s in map(_span, tensors) if s[0] and s[1] > s[0])
    return all(a[1] <= b[0] for a, b in pairwise(spans))


def _shares_memory(t: torch.Tensor, others: Sequence[torch.Tensor]) -> bool:
    lo, hi = _span(t)
    if not lo or hi <= lo:
        return False
    return any(o_lo < hi and lo < o_hi for o_lo, o_hi in map(_span, others) if o_lo)


def overlaps_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (``expand``, overlapping ``as_strided``).
    NOTE: sufficient for no overlap: each stride, smallest first, passes the last element the
    smaller ones reach; a layout that interleaves without overlap also counts as overlapping."""
    if t.numel() == 0:
        return False
    reach = 0
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _no_alias_guard(
    leaves: Sequence[Any],
    used: Sequence[int],
    state: Sequence[torch.Tensor],
    written: Sequence[tuple[str, int]] = (),
    consts: Sequence[torch.Tensor] = (),
    traced_as_other: set[int] | frozenset[int] = frozenset(),
) -> Guard:
    """``traced_as_other``: the leaves traced as another (an earlier leaf or a state tensor
    they are, guarded by the identity guard): one tensor of the program, read once here."""
    tensor_ix = [
        i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and i not in traced_as_other
    ]
    state_ix = [k for k in used if isinstance(state[k], torch.Tensor)]
    written_leaves = [i for where, i in written if where == "user"]
    written_state = [k for where, k in written if where == "state"]
    written_consts = {k for where, k in written if where == "const" and k < len(consts)}

    def tensors(leaves: Sequence[Any], state: Sequence[Any]) -> list[torch.Tensor]:
        return [leaves[i] for i in tensor_ix] + [state[k] for k in state_ix]

    def targets(leaves: Sequence[Any], state: Sequence[Any]) -> list[torch.Tensor]:
        return [leaves[i] for i in written_leaves] + [state[k] for k in written_state]

    def dense_writes(leaves: Sequence[Any], state: Sequence[Any]) -> bool:
        writes = targets(leaves, state) + [consts[k] for k in written_consts]
        return not any(overlaps_itself(t) for t in writes)

    def consts_apart(leaves: Sequence[Any], state: Sequence[Any]) -> bool:
        """No constant shares memory with a tensor the program writes, and no written
        constant with any other tensor it reads."""
        if not consts:
            return True
        read, written_now = tensors(leaves, state), targets(leaves, state)
        for k, c in enumerate(consts):
            others = [t for j, t in enumerate(consts) if j != k]
            pool = (
                read + others
                if k in written_consts
                else written_now + [consts[j] for j in written_consts if j != k]
            )
            if _shares_memory(c, pool):
                return False
        return True

    if not consts_apart(leaves, state):
        raise GraphCaptureError(
            "inputs",
            "the program writes a tensor that shares memory with a tensor it reads as a "
            "constant (a global, a closure, an attribute that is not a parameter or buffer), "
            "or writes such a constant that shares memory with an input, parameter or buffer: "
            "pass the tensor as an argument instead",
            kind="limitation",
        )
    if not _distinct_memory(tensors(leaves, state)):
        raise GraphCaptureError(
            "inputs",
            "the program writes an input, parameter or buffer that shares memory with another "
            "tensor it reads (a view of it, or a tensor it is a view of)",
            kind="limitation",
        )
    if not dense_writes(leaves, state):
        raise GraphCaptureError(
            "inputs",
            "the program writes in place into an input or buffer whose elements overlap in "
            "memory (expand, as_strided): eager's result depends on its order of visits; "
            "pass a copy (.clone()) instead",
            kind="limitation",
        )
    return Guard(
        "alias",
        "inputs",
        "tensor inputs and the parameters and buffers read do not share memory, and none the "
        "program writes overlaps itself",
        True,
        lambda env: (
            _distinct_memory(tensors(env.leaves, env.state))
            and dense_writes(env.leaves, env.state)
            and consts_apart(env.leaves, env.state)
        ),
    )

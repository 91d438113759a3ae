"""A captured program: the graph plus how a call feeds it and how its results come back.

:meth:`CapturedProgram.run` is the calling convention every backend shares: it gathers the graph
inputs (user tensors from the call, the module's *live* parameters and buffers, constants), runs
the graph with a backend's executor, writes mutated inputs and buffers back with ``copy_``, and
rebuilds the user's output structure.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.errors import InternalValueError
from plait.frontend import output_views, pytree
from plait.frontend.input_writes import write_back
from plait.guards.guard import GuardEnv, GuardSet
from plait.ir import Graph, Value

# NOTE: an executor takes the graph's input values (in the captured graph's input order) and
# returns its outputs; it holds whatever graph it runs itself.
Executor = Callable[[list[Any]], Sequence[Any]]


@dataclass(frozen=True)
class InputSlot:
    """Where graph input ``i`` comes from: ``("user", leaf index)``, ``("state", entry index)``
    or ``("const", tensor)``."""

    source: str
    ref: Any


@dataclass(frozen=True)
class OutputLeaf:
    """One leaf of the output: ``("graph", (output index, tracer id, fresh))`` (a computed
    tensor; ``fresh`` when eager gives it memory of its own),
    ``("input", slot index)`` (an input tensor returned as such), ``("object", k)`` (the
    call's own ``k``-th input container, :func:`plait.frontend.pytree.containers`),
    ``("alias", (slot index, size, stride, storage offset, requires_grad[, dtype]))`` (a view
    of an input: made from it on each call, offset relative to its own; read as ``dtype``
    first when one is named), ``("view", (output index, tracer id, size, stride, offset,
    requires_grad, base size, base stride[, dtype]))`` (a view of another output, made from the
    graph's output ``index``: :mod:`plait.frontend.output_views`) or ``("value", obj)``."""

    source: str
    ref: Any


@dataclass(frozen=True)
class Continued:
    """The result of the call whose capture went on eagerly after a refusal while its program
    ran (:mod:`plait.frontend.continuation`): that call returns ``output`` as it is."""

    output: Any
    containers = False  # NOTE: as CapturedProgram's: it needs none of the caller's containers


@dataclass
class CapturedProgram:
    graph: Graph | None
    guards: GuardSet
    semantic_hash: str | None
    inputs: list[InputSlot] = field(default_factory=list)
    out_spec: Any = None
    out_leaves: list[OutputLeaf] = field(default_factory=list)
    # NOTE: per graph output, the memory format eager gave it (output_views.eager_layout)
    out_layouts: list[str | None] = field(default_factory=list)
    mutations: list[tuple[int, int]] = field(default_factory=list)
    # NOTE: the input containers (pytree.containers) whose final contents end the output, and
    # whether a call must find its own containers (to write them or return one)
    written_objects: list[int] = field(default_factory=list)
    containers: bool = False
    # NOTE: the Python attributes the program sets on tensors, set again after each call
    # (plait.frontend.tensor_attr_writes: ``(where, ref, ((name, value), ...))``)
    attr_writes: list[tuple[str, Any, tuple[tuple[str, Any], ...]]] = field(default_factory=list)
    opaque_counts: dict[str, int] = field(default_factory=dict)
    # NOTE: per opaque target, why its call became no ATen program (the first call's reason)
    opaque_reasons: dict[str, str] = field(default_factory=dict)
    fallback_reason: str | None = None
    dynamic: bool = False
    specialized: list[str] = field(default_factory=list)  # dynamic=True: sizes made static, why
    # NOTE: arithmetic="skip": the calls capture left uncomputed, or why it captured again
    # computing every call (plait.frontend.unsampled)
    uncomputed: int = 0
    resampled: str | None = None
    guard_plan: Any = None  # the GuardPlan the guards were built from (None: built otherwise)
    # NOTE: a fallback's GraphCaptureError (operation, file and line), for regional compilation
    fallback_error: Exception | None = field(default=None, repr=False, compare=False)
    # NOTE: a fallback refused after the program's Python ran to its end: the program of the
    # call that captured it, which that call runs instead of the Python again; taken off by
    # the engine, never saved
    # (plait.frontend.refused_after_run), or the result of that call, where it went on
    # eagerly after a refusal while it ran (plait.frontend.continuation)
    this_call: CapturedProgram | Continued | None = field(default=None, repr=False, compare=False)
    # NOTE: (the inputs list, its length, its InputGather): graph_inputs' plan for that list
    _gather: Any = field(default=None, init=False, repr=False, compare=False)

    def symbolic_dims(self) -> dict[str, str]:
        """Each input dim captured as a symbol (``"x.shape[0]"``) -> the symbol's name."""
        plan = self.guard_plan
        if plan is None or not plan.dynamic:
            return {}
        out = {plan.symbols[s][2]: str(s) for s in plan.bindings}
        out.update({src: str(s) for _, _, src, s in plan.duck})
        return out

    @property
    def has_graph(self) -> bool:
        """False for a fallback program (no graph; eager PyTorch runs it)."""
        return self.graph is not None

    def interface(self) -> tuple[list[Value], frozenset[str]]:
        """The graph's inputs and the names of the values it returns: what keying, binding and
        running the program need, without its nodes (``([], frozenset())`` for a fallback)."""
        if self.graph is None:
            return [], frozenset()
        returned = frozenset(o.name for o in self.graph.outputs if isinstance(o, Value))
        return self.graph.inputs, returned

    def written_inputs(self) -> frozenset[str]:
        """The names of the graph inputs this program writes (an in-place update copied back
        after each call) or returns as they are: never constants, whatever else is frozen."""
        inputs, returned = self.interface()
        mutated = {inputs[i].name for i, _ in self.mutations}
        return frozenset(mutated | (returned & {v.name for v in inputs}))

    def graph_inputs(self, env: GuardEnv, state: Sequence[torch.Tensor]) -> list[Any]:
        """The graph's input values for a call: the call's leaves, the state's entries and the
        constants the slots name, in the graph's order (one C-level gather)."""
        plan = self._gather
        if plan is None or plan[0] is not self.inputs or plan[1] != len(self.inputs):
            plan = self._gather = (self.inputs, len(self.inputs), InputGather(self.inputs))
        return plan[2](env.leaves, state)

    def run(
        self,
        execute: Executor,
        env: GuardEnv,
        state: Sequence[torch.Tensor],
        containers: Sequence[Any] = (),
    ) -> Any:
        """``containers``: the call's own (``InputAdapter.containers``), when
        :attr:`containers` says the program writes or returns one."""
        assert self.has_graph, "a fallback program has no graph to run"
        values = self.graph_inputs(env, state)
        results = list(execute(values))
        if self.mutations:
            results = _apart_from_writes(results, [values[i] for i, _ in self.mutations])
            with torch.no_grad():
                for i, o in self.mutations:
                    values[i].copy_(results[o])
        inputs = _Members(values)
        by_tracer: dict[int, Any] = {}
        handed_out: set[int] = set()
        views = [leaf.ref for leaf in self.out_leaves if leaf.source == "view"]
        bases = None
        if views:
            # NOTE: every value's id, tensor or not: each is alive for the call, so none of
            # the others shares a tensor's id (the membership tests ask only about tensors)
            bases = output_views.Bases(views, results, inputs.id_set(), handed_out)
        leaves: list[Any] = []
        for leaf in self.out_leaves:
            if leaf.source == "value":
                leaves.append(leaf.ref)
            elif leaf.source == "input":
                leaves.append(values[leaf.ref])
            elif leaf.source == "alias":
                leaves.append(_view_of(values, leaf.ref))
            elif leaf.source == "object":
                leaves.append(containers[leaf.ref])
            elif leaf.source == "view":
                assert bases is not None
                leaves.append(bases.view(leaf.ref))
            else:
                index, tracer_id, fresh = leaf.ref
                if tracer_id in by_tracer:
                    leaves.append(by_tracer[tracer_id])
                    continue
                if bases is not None and index in bases.layouts:
                    by_tracer[tracer_id] = bases.base(index)  # NOTE: the base other outputs view
                    leaves.append(by_tracer[tracer_id])
                    continue
                layout = self.out_layouts[index] if index < len(self.out_layouts) else None
                t = output_views.in_eager_layout(results[index], layout)
                # NOTE: a fresh tensor in eager (a clone, or one returned twice under different
                # names) must not come back as an input's memory or as another output's.
                if fresh and isinstance(t, torch.Tensor) and (id(t) in handed_out or t in inputs):
                    t = t.clone()
                by_tracer[tracer_id] = t
                handed_out.add(id(t))
                leaves.append(t)
        if self.attr_writes:
            _set_attributes(self.attr_writes, env.leaves, state, leaves)
        out = pytree.unflatten(self.out_spec, leaves)
        if not self.written_objects:
            return out
        out, finals = out
        write_back(list(containers), self.written_objects, finals)
        return out


def _set_attributes(
    writes: Sequence[tuple[str, Any, tuple[tuple[str, Any], ...]]],
    leaves: Sequence[Any],
    state: Sequence[Any],
    outputs: Sequence[Any],
) -> None:
    """The Python attributes the program sets, set on this call's tensors: its inputs, the
    module's parameters and buffers, the constants it reads, the tensors it returns."""
    for where, ref, items in writes:
        if where == "user":
            t = leaves[ref]
        elif where == "state":
            t = state[ref]
        else:
            t = outputs[ref] if where == "output" else ref
        for name, value in items:
            setattr(t, name, value)


class InputGather:
    """Gathers a call's graph inputs as ``slots`` name them: one ``itemgetter`` over the
    leaves, the state and the constants laid end to end (no Python loop over the slots; a
    call's kernels leave the slots' objects out of cache).

    Example:
        >>> gather = InputGather([InputSlot("state", 1), InputSlot("user", 0)])
        >>> gather(["x"], ["w0", "w1"])
        ['w1', 'x']
    """

    def __init__(self, slots: Sequence[InputSlot]) -> None:
        self.users = 1 + max((s.ref for s in slots if s.source == "user"), default=-1)
        self.states = 1 + max((s.ref for s in slots if s.source == "state"), default=-1)
        self.consts = tuple(s.ref for s in slots if s.source not in ("user", "state"))
        where, k = [], 0
        for s in slots:
            if s.source == "user":
                where.append(s.ref)
            elif s.source == "state":
                where.append(self.users + s.ref)
            else:
                where.append(self.users + self.states + k)
                k += 1
        self.n = len(where)
        self.get = operator.itemgetter(*where) if where else None

    def __call__(self, leaves: Sequence[Any], state: Sequence[Any]) -> list[Any]:
        # NOTE: the guards hold the leaves' and the state's structure: a shorter call is a bug,
        # never a short list of inputs
        if len(leaves) < self.users or len(state) < self.states:
            raise InternalValueError(
                f"graph inputs name {self.users} leaves and {self.states} state entries; "
                f"the call has {len(leaves)} and {len(state)}"
            )
        if self.get is None:
            return []
        laid = [*leaves[: self.users], *state[: self.states], *self.consts]
        return [self.get(laid)] if self.n == 1 else list(self.get(laid))


class _Members:
    """Whether an object is one of a call's values, by identity: a C-level scan of the list for
    the first few questions (a call of one or two outputs builds no set), a set of ids after."""

    SCANS = 4

    def __init__(self, values: list[Any]) -> None:
        self.values, self.asked = values, 0
        self.ids: set[int] | None = None

    def id_set(self) -> set[int]:
        # NOTE: every value's id, tensor or not: each is alive for the call, so none of the
        # others shares a tensor's id (the membership tests ask only about tensors)
        if self.ids is None:
            self.ids = {id(v) for v in self.values}
        return self.ids

    def __contains__(self, obj: Any) -> bool:
        if self.ids is None and self.asked < self.SCANS:
            self.asked += 1
            return any(map(operator.is_, itertools.repeat(obj), self.values))
        return id(obj) in self.id_set()


def _apart_from_writes(results: list[Any], written: list[Any]) -> list[Any]:
    """``results``, each tensor that shares memory with an input the call writes back copied
    first. A graph passes an input's value through as it is (``out = x.clone(); x.add_(1);
    return out``, a swap of two buffers): that result *is* the input, and the write-back would
    change it before it is returned or copied into another input."""
    ptrs = {p for p in (_memory(t) for t in written) if p}
    return [t.clone() if isinstance(t, torch.Tensor) and _memory(t) in ptrs else t for t in results]


def _memory(t: Any) -> int:
    """The address of a tensor's storage (0: none, or no tensor)."""
    if not isinstance(t, torch.Tensor):
        return 0
    return int(t.untyped_storage().data_ptr())


def _view_of(values: list[Any], ref: Sequence[Any]) -> torch.Tensor:
    """The view an output was of its input at capture, made again of this call's input: the
    same memory, as in eager (the input's strides are guarded)."""
    slot, size, stride, offset, requires_grad, *reread = ref
    base = values[slot]
    if not requires_grad:
        base = base.detach()  # NOTE: shares memory and version counter; no gradient, as eager
    if reread:  # NOTE: a view reading the input's bits as another dtype (view_as_complex)
        dtype = getattr(torch, str(reread[0]), None)
        if not isinstance(dtype, torch.dtype):
            raise InternalValueError(f"an output view names no dtype: {reread[0]!r}")
        base = base.view(dtype)
    return base.as_strided(tuple(size), tuple(stride), base.storage_offset() + offset)

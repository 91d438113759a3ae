"""Partition a joint graph into a forward graph and a backward graph.

The forward graph returns the user's outputs, then the values it saves for the backward; the
backward graph takes those saved values, then the cotangents, and returns the gradients. Two
partitioners choose what to save:

- ``save-all``: the forward computes every node its outputs need; the backward computes the rest
  and reads every forward value it uses as a saved value.
- ``min-cut``: cheap pointwise and view nodes may be recomputed in the backward from other saved
  values; the saved set is a minimum cut (in bytes) of the forward's dataflow between what must
  run in the forward and what the backward reads. It never saves more bytes than ``save-all``
  (the ``save-all`` set is one of the cuts it minimizes over). With ``renormalize`` (the Triton
  target), a training batch norm's normalized result is recomputable too, as pointwise
  arithmetic of its input and batch statistics (:mod:`plait.autograd.renormalize`): the ReLU
  after it need not be saved.

Invariant (checked): the backward reads only saved values and cotangents.

A backward whose shapes hold a size symbol that none of its inputs has as a dim (the backward of
``x.transpose(0, 1).reshape(-1, n).sum(0)`` takes one cotangent of ``n`` elements, yet rebuilds
``x``'s shape ``[s0, s1, n]``) reads the symbol from one more saved value, a *symbol carrier*: an
empty tensor ``zeros([s0, s1, 0])`` the forward makes (no element, no memory), whose dims are
the symbols the forward bound from its own inputs at that call (:func:`carry_symbols`).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.autograd import build_joint
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((8,), torch.float32))
    >>> b.output(b.call("sin", b.call("exp", x)))
    >>> joint = build_joint(b.build(), wrt=["x"])
    >>> [v.name for v in partition(joint, "min-cut").saved]  # exp(x): both derivatives read it
    ['0']
    >>> partition(joint, "save-all").saved_bytes, partition(joint, "min-cut").saved_bytes
    (32, 32)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import networkx as nx
import sympy
import torch

from plait.autograd.joint import Joint
from plait.autograd.renormalize import Chain, fold_normalize_chains, with_normalize_chains
from plait.errors import InvalidOptionError, PlaitCompileError
from plait.ir.graph import Graph, Node, Operand, Value
from plait.ir.ops import Category, get_op
from plait.ir.types import TensorType
from plait.ir.verify import verify
from plait.symbolic import UNBACKED_RE

PARTITIONERS = ("save-all", "min-cut")


class PartitionError(PlaitCompileError, ValueError):
    """A partition would make the backward read something the forward did not save."""

    error_code = "PLAIT-C121"


@dataclass
class Partition:
    """``forward``: the joint's forward inputs; its outputs, then ``saved``. ``backward``:
    ``saved`` then the cotangents; the gradients. ``recomputed``: node ids the backward computes
    again instead of reading them saved. ``renormalized``: the batch-norm nodes whose normalized
    result the backward computes again (:mod:`plait.autograd.renormalize`)."""

    forward: Graph
    backward: Graph
    saved: list[Value]
    recomputed: list[int]
    partitioner: str
    renormalized: list[int] = field(default_factory=list)

    @property
    def saved_bytes(self) -> int:
        return sum(value_bytes(v) for v in self.saved)


# NOTE: the size the cut assumes for a symbolic or data-dependent dim (its cost is a weight,
# never an allocation)
SYMBOLIC_DIM_GUESS = 1024


def value_bytes(v: Value) -> int:
    """Bytes of a tensor value; a dim that is not an integer counts as SYMBOLIC_DIM_GUESS."""
    t = v.type
    if not isinstance(t, TensorType):
        return 0
    n = 1
    for d in t.shape:
        n *= int(d) if isinstance(d, int) or getattr(d, "is_Integer", False) else SYMBOLIC_DIM_GUESS
    return n * t.dtype.itemsize


def partition(joint: Joint, partitioner: str = "min-cut", renormalize: bool = False) -> Partition:
    """Split ``joint`` into a forward and a backward graph (see the module doc). ``renormalize``
    (min-cut only): a training batch norm's normalized result may be computed again in the
    backward from its saved input and batch statistics (:mod:`plait.autograd.renormalize`; the
    Triton target's choice: the forward's kernel computes it in the same order)."""
    if partitioner not in PARTITIONERS:
        raise InvalidOptionError(
            f"unknown partitioner {partitioner!r}; known: {list(PARTITIONERS)}"
        )
    chains: list[Chain] = []
    if renormalize and partitioner == "min-cut":
        graph, n_forward, chains = with_normalize_chains(joint.graph, joint.n_forward_nodes)
        joint = replace(joint, graph=graph, n_forward_nodes=n_forward)
    g = joint.graph
    forward_nodes = _needed(g, _forward_roots(g, joint), stop=set())
    if partitioner == "save-all":
        saved = _read_by_others(g, joint, forward_nodes)
    else:
        saved = _min_cut(g, joint, forward_nodes)
    part = _split(joint, saved, partitioner)
    if chains:
        part.forward = fold_normalize_chains(part.forward, chains)
        bwd = {n.id for n in part.backward.nodes}
        part.renormalized = [c.source for c in chains if c.last in bwd]
    _refuse_unbound_unbacked(part.backward)
    return carry_symbols(part, g)


def _refuse_unbound_unbacked(backward: Graph) -> None:
    """Raises :class:`PartitionError` when the backward's shapes or attributes hold a
    data-dependent size (``dd0``: boolean-mask indexing, ``masked_select``, ``nonzero``) that
    no node of the backward makes and no backward input has as a dim: the backward of
    ``masked_select(x, m).sum()`` takes a scalar cotangent, yet expands it to ``[dd0]``. A
    compiled program binds sizes from its inputs and a carrier cannot hold this one, so the
    compile falls back to eager autograd for the backward, as for a saved value of such a size.
    """
    made = {
        str(d)
        for v in backward.inputs
        if isinstance(v.type, TensorType)
        for d in v.type.shape
        if isinstance(d, sympy.Symbol) and UNBACKED_RE.match(str(d))
    }  # NOTE: an input's own dim binds it (an interpreted backward; Stax refuses such an input)
    for n in backward.nodes:
        before = _unbacked_symbols([*n.input_values(), *n.attrs.values()])
        made |= _unbacked_symbols([v.type for v in n.outputs]) - before
    used: set[str] = set()
    for n in backward.nodes:
        used |= _unbacked_symbols([*(v.type for v in n.input_values()), *n.attrs.values()])
        used |= _unbacked_symbols([v.type for v in n.outputs])
    missing = sorted(used - made)
    if missing:
        raise PartitionError(
            f"the backward needs the data-dependent size(s) {missing} of the forward (boolean-mask "
            "indexing, masked_select, nonzero...): compiled backwards take static or symbolic "
            "sizes only"
        )


def _unbacked_symbols(items: Iterable[Any]) -> set[str]:
    """Names of the data-dependent (unbacked) size symbols in ``items``: types, attributes."""
    out: set[str] = set()

    def visit(x: Any) -> None:
        if isinstance(x, sympy.Expr):
            out.update(str(s) for s in x.free_symbols if UNBACKED_RE.match(str(s)))
        elif isinstance(x, TensorType):
            for d in x.shape:
                visit(d)
        elif isinstance(x, Value):
            visit(x.type)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)

    for x in items:
        visit(x)
    return out


def _producers(g: Graph) -> dict[int, Node]:
    return {id(v): n for n in g.nodes for v in n.outputs}


def _needed(g: Graph, roots: Iterable[Value], stop: set[int]) -> set[int]:
    """Ids of the nodes computing ``roots``, not looking past values in ``stop``."""
    made = _producers(g)
    seen: set[int] = set()
    work = [v for v in roots if id(v) not in stop]
    while work:
        v = work.pop()
        node = made.get(id(v))
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        work.extend(u for u in node.input_values() if id(u) not in stop)
    return seen


def _forward_roots(g: Graph, joint: Joint) -> list[Value]:
    """What the forward must compute: the user's outputs and every random node of the forward
    (NOTE: a draw or a ``manual_seed`` nothing reads still moves the generator: dropped, every
    later draw and the generator's state after the call would not be eager's)."""
    outputs = [o for o in g.outputs[: joint.n_outputs] if isinstance(o, Value)]
    forward = g.nodes[: joint.n_forward_nodes]
    return outputs + [v for n in forward if get_op(n.op).is_random(n.attrs) for v in n.outputs]


def _backward_roots(g: Graph, joint: Joint) -> list[Value]:
    return [o for o in g.outputs[joint.n_outputs :] if isinstance(o, Value)]


def _cotangent_ids(g: Graph, joint: Joint) -> set[int]:
    return {id(v) for v in g.inputs[joint.n_inputs :]}


def _read_by_others(g: Graph, joint: Joint, forward_nodes: set[int]) -> list[Value]:
    """save-all: every forward value (or forward input) a node outside the forward reads."""
    cots = _cotangent_ids(g, joint)
    backward = _needed(g, _backward_roots(g, joint), stop=cots) - forward_nodes
    in_forward = {id(v) for v in g.inputs[: joint.n_inputs]}
    in_forward |= {id(v) for n in g.nodes if n.id in forward_nodes for v in n.outputs}
    saved: dict[int, Value] = {}
    for n in g.nodes:
        if n.id in backward:
            for v in n.input_values():
                if id(v) in in_forward:
                    saved.setdefault(id(v), v)
    for o in _backward_roots(g, joint):  # NOTE: a gradient that is a forward value as it is
        if id(o) in in_forward:
            saved.setdefault(id(o), o)
    return _in_graph_order(g, saved)


def _in_graph_order(g: Graph, chosen: dict[int, Value]) -> list[Value]:
    order = [*g.inputs, *(v for n in g.nodes for v in n.outputs)]
    return [v for v in order if id(v) in chosen]


# NOTE: transcendental pointwise ops, recomputed in the backward only off the CPU: a GPU's
# backward kernel that reads their input computes them at no cost (it is bound by memory), a CPU
# pays what the forward paid (a GPT-2 block's GELU: 0.3 ms of a 16.8 ms training step)
COSTLY_ON_CPU = frozenset(
    {"exp", "expm1", "log", "log1p", "tanh", "erf", "sigmoid", "silu", "gelu", "pow", "mish",
     "softplus", "elu", "sin", "cos"}
)  # fmt: skip


def recomputable(node: Node) -> bool:
    """Cheap to compute again in the backward: pointwise (not random) and view nodes, except a
    transcendental one whose result is on the CPU (``COSTLY_ON_CPU``)."""
    op = get_op(node.op)
    if op.is_random(node.attrs):
        return False
    if node.op in COSTLY_ON_CPU and _on_cpu(node):
        return False
    return op.category in (Category.POINTWISE, Category.VIEW)


def _on_cpu(node: Node) -> bool:
    t = node.outputs[0].type if node.outputs else None
    return isinstance(t, TensorType) and t.device == "cpu"  # NOTE: canonical: "cpu:0" is "cpu"


def _min_cut(g: Graph, joint: Joint, forward_nodes: set[int]) -> list[Value]:
    """The cheapest set of values (in bytes) separating what the forward must compute from what
    the backward reads; recomputable nodes may fall on the backward's side. Of cuts of equal
    bytes, the one with the fewest views: a saved view is a copy (a program's output has its
    own storage), its base's views are free to take again in the backward (q, k and v split
    from one projection: the projection is saved, not three copies of its thirds)."""
    cots = _cotangent_ids(g, joint)
    roots = _backward_roots(g, joint)
    backward = _needed(g, roots, stop=cots) - forward_nodes
    made = _producers(g)
    tainted = set(cots)  # NOTE: values computed from a cotangent: never in the forward
    for n in g.nodes:
        if any(id(v) in tainted for v in n.input_values()):
            tainted.update(id(v) for v in n.outputs)
    # NOTE: the region either side may hold: the forward's inputs and values, and the values of
    # recomputable backward nodes that read no cotangent. A saved value is an in->out edge cut.
    region: dict[int, Value] = {id(v): v for v in g.inputs[: joint.n_inputs]}
    for n in g.nodes:
        helper = n.id in backward and recomputable(n) and not set(map(id, n.outputs)) & tainted
        if n.id in forward_nodes or helper:
            region.update((id(v), v) for v in n.outputs)
    flow = nx.DiGraph()
    # NOTE: bytes scaled past the count of values, plus one per view: only ties are broken
    scale = len(region) + 1
    for key, v in region.items():
        node = made.get(key)
        view = node is not None and get_op(node.op).category == Category.VIEW
        flow.add_edge(("in", key), ("out", key), capacity=value_bytes(v) * scale + int(view))
        if node is None or not recomputable(node):
            flow.add_edge("source", ("in", key), capacity=math.inf)
        else:
            for u in node.input_values():
                flow.add_edge(("out", id(u)), ("in", key), capacity=math.inf)
    for n in g.nodes:
        if n.id in backward and id(n.outputs[0]) not in region:
            for u in n.input_values():
                if id(u) in region:
                    flow.add_edge(("out", id(u)), "sink", capacity=math.inf)
    for o in roots:
        if id(o) in region:
            flow.add_edge(("out", id(o)), "sink", capacity=math.inf)
    if "sink" not in flow:
        return []
    _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    saved = {
        key: v
        for key, v in region.items()
        if ("in", key) in reachable and ("out", key) not in reachable
    }
    return _in_graph_order(g, saved)


def _split(joint: Joint, saved: list[Value], partitioner: str) -> Partition:
    g = joint.graph
    saved_ids = {id(v) for v in saved}
    cots = list(g.inputs[joint.n_inputs :])
    roots = _backward_roots(g, joint)
    fwd_ids = _needed(g, [*_forward_roots(g, joint), *saved], stop=set())
    bwd_ids = _needed(g, roots, stop=saved_ids | {id(v) for v in cots})
    reachable = {id(v) for v in cots} | saved_ids
    for n in g.nodes:
        if n.id in bwd_ids:
            for u in n.input_values():
                if id(u) not in reachable:
                    raise PartitionError(
                        f"the backward reads %{u.name} (from node {n.id}, {n.op}), which the "
                        "forward does not save"
                    )
            reachable.update(id(v) for v in n.outputs)
    for o in roots:
        if id(o) not in reachable:
            raise PartitionError(f"the gradient %{o.name} is neither saved nor computed")
    forward = _subgraph(
        g, list(g.inputs[: joint.n_inputs]), fwd_ids, [*g.outputs[: joint.n_outputs], *saved]
    )
    forward_ids = {n.id for n in g.nodes[: joint.n_forward_nodes]}
    recomputed = sorted(bwd_ids & forward_ids)
    order = _recompute_late(g, bwd_ids, set(recomputed))
    backward = _subgraph(g, [*saved, *cots], bwd_ids, list(roots), order)
    return Partition(forward, backward, list(saved), recomputed, partitioner)


def _recompute_late(g: Graph, node_ids: set[int], late: set[int]) -> list[Node]:
    """``g``'s nodes in ``node_ids`` in graph order, except that each node in ``late`` (a
    forward node the backward recomputes) comes just before the first node that reads it (its
    own late inputs before it). In the joint's order every recomputed node would come first,
    so each recomputed value would be live from the backward's start to its last read: all
    of them at once, as many bytes as saving them."""
    producer = {id(v): n for n in g.nodes if n.id in late for v in n.outputs}
    placed: set[int] = set()
    order: list[Node] = []

    def place(n: Node) -> None:
        stack: list[tuple[Node, bool]] = [(n, False)]
        while stack:
            node, ready = stack.pop()
            if node.id in placed:
                continue
            if ready:
                placed.add(node.id)
                order.append(node)
                continue
            stack.append((node, True))
            for u in reversed(list(node.input_values())):
                m = producer.get(id(u))
                if m is not None and m.id not in placed:
                    stack.append((m, False))

    for n in g.nodes:
        if n.id in node_ids and n.id not in late:
            place(n)
    for n in g.nodes:  # NOTE: a late node no other reads (an output itself), in graph order
        if n.id in late:
            place(n)
    return order


def _subgraph(
    g: Graph,
    inputs: list[Value],
    node_ids: set[int],
    outputs: list[Operand],
    order: list[Node] | None = None,
) -> Graph:
    """A graph of ``g``'s nodes in ``node_ids`` (in ``order`` where given, else in graph
    order), reading ``inputs``; values are copied, so the two partitions share nothing. An
    input that was a computed value is a ``user`` input."""
    mapping: dict[int, Value] = {}
    out = Graph(constants={k: v for k, v in g.constants.items()})
    for v in inputs:
        new = Value(v.name, v.type, None, 0, v.kind or "user")
        mapping[id(v)] = new
        out.inputs.append(new)
    for n in g.nodes if order is None else order:
        if n.id not in node_ids:
            continue
        node = Node(n.id, n.op, tuple(_remap(mapping, o) for o in n.inputs), dict(n.attrs))
        node.outputs = tuple(Value(v.name, v.type, node, v.index) for v in n.outputs)
        for old, new in zip(n.outputs, node.outputs):
            mapping[id(old)] = new
        out.nodes.append(node)
    out.outputs = [_remap(mapping, o) for o in outputs]
    names = {v.name for v in out.inputs}
    out.constants = {k: v for k, v in out.constants.items() if k in names}
    verify(out)
    return out


def _remap(mapping: dict[int, Value], o: Operand) -> Operand:
    if isinstance(o, Value):
        return mapping[id(o)]
    return o


# --- symbol carriers ----------------------------------------------------------------------------
CARRIER_NAME = "symbols_for_backward"


def carry_symbols(part: Partition, joint_graph: Graph) -> Partition:
    """``part`` with a symbol carrier (module doc) saved for the backward when its shapes hold
    symbols no backward input has as a dim and the forward binds from an input dim: the forward
    returns ``zeros([*symbols, 0])`` as its last saved value, and the backward takes it after
    the other saved values. Unchanged when nothing is missing.

    NOTE: sound by construction: the carrier's dims are the forward call's own sizes (the
    forward's inputs bind them), the very sizes its saved values and cotangents were made at;
    a symbol no forward input binds is left out (Stax refuses such a graph by name)."""
    missing = _graph_symbols(part.backward) - set(_bound_symbols(part.backward))
    by_name = _bound_symbols(part.forward)
    carried = [by_name[n] for n in sorted(missing) if n in by_name]
    if not carried:
        return part
    device = next(
        (v.type.device for v in part.forward.inputs if isinstance(v.type, TensorType)), "cpu"
    )
    taken = {v.name for g in (joint_graph, part.forward, part.backward) for v in _all_values(g)}
    name = CARRIER_NAME
    while name in taken:
        name += "_"
    shape = (*carried, 0)
    t = TensorType(shape, torch.float32, device)
    attrs: dict[str, Any] = {"shape": shape, "dtype": torch.float32, "device": device}
    node = Node(max((n.id for n in joint_graph.nodes), default=-1) + 1, "zeros", (), attrs)
    node.outputs = (Value(name, t, node, 0),)
    part.forward.nodes.append(node)
    part.forward.outputs.append(node.outputs[0])
    n_saved = len(part.saved)
    part.backward.inputs.insert(n_saved, Value(name, t, None, 0, "user"))
    part.saved.append(node.outputs[0])
    verify(part.forward)
    verify(part.backward)
    return part


def _all_values(g: Graph) -> Iterable[Value]:
    yield from g.inputs
    for n in g.nodes:
        yield from n.outputs


def _bound_symbols(g: Graph) -> dict[str, sympy.Symbol]:
    """The symbols that are exactly some input's dim (where a compiled call reads its sizes)."""
    return {
        str(d): d
        for v in g.inputs
        if isinstance(v.type, TensorType)
        for d in v.type.shape
        if isinstance(d, sympy.Symbol) and not UNBACKED_RE.match(str(d))
    }


def _graph_symbols(g: Graph) -> set[str]:
    """The size symbols (unbacked ones aside) of ``g``'s types, node attributes and operands."""
    out: set[str] = set()

    def visit(x: Any) -> None:
        if isinstance(x, sympy.Expr):
            out.update(str(s) for s in x.free_symbols if not UNBACKED_RE.match(str(s)))
        elif isinstance(x, TensorType):
            for d in x.shape:
                visit(d)
        elif isinstance(x, (list, tuple)):
            for y in x:
                visit(y)

    for v in _all_values(g):
        visit(v.type)
    for n in g.nodes:
        visit(list(n.attrs.values()))
        visit(list(n.inputs))
    return out

"""Training batch norm's normalized result as pointwise arithmetic the backward can recompute.

A training batch norm is one ATen call (``plait.autograd.joint``) whose normalized result ``y``
no partition can recompute: the call is extern. Its backward saves the input ``x`` and the
per-channel batch mean and inverse standard deviation anyway (``native_batch_norm_backward``
reads them), so ``y`` (and the ReLU after it, the next convolution's input, which that
convolution's weight gradient reads) can be computed again in the backward from values saved
already, per element:

    y = to_dtype((to_float32(x) - mean) * (invstd * to_float32(weight)) + to_float32(bias))

the order of plait's Triton normalize kernel (:mod:`plait.codegen.cuda_batch_norm_kernels`),
which runs the forward's batch norm on the Triton target. :func:`with_normalize_chains` makes
the joint graph read ``y`` through such a chain of pointwise and view nodes (the ATen call's
result 0 then has no reader), so that the min-cut may put the chain, and the ReLU reading it,
on the backward's side rather than save the ReLU's result: on a ResNet, one activation per
batch norm fewer. :func:`fold_normalize_chains` gives the forward back its kernel's result: a
forward that keeps a chain reads the ATen call's result 0 instead (bitwise the forward it was),
so only the backward computes the chain.

The forward's kernel and the backward's chain compute ``y`` in the same order of operations;
on CUDA, rounding of a contracted multiply-add may differ between the two kernels (within the
contract's normalization row). The Triton target only: the CPU's ATen kernel computes
``x * alpha + beta`` (another rounding), and a CPU pays for the recomputation what its forward
paid (no GPU memory to save).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plait.ir.builder import GraphBuilder
from plait.ir.graph import Graph, Node, Value
from plait.ir.ops.batch_norm_relu import FORWARD, bound_slots
from plait.ir.types import TensorType
from plait.ir.verify import verify

# NOTE: the input dtypes of plait's Triton batch-norm kernels (cuda_batch_norm.DTYPES)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Chain:
    """The ATen batch-norm node ``source``, the node ``last`` whose result 0 is the chain's
    ``y``, and all the chain's ``nodes`` (node ids of the joint graph)."""

    source: int
    last: int
    nodes: frozenset[int]


def _operands(node: Node) -> tuple[Value, Value | None, Value | None] | None:
    """The input, weight and bias of a training batch norm whose normalized result a chain can
    recompute (a float32 or 16-bit input of rank 2 or more and static channels, float32
    statistics); None for any other node."""
    if node.op != "aten" or (node.attrs["name"], node.attrs["overload"]) not in FORWARD:
        return None
    a = node.attrs
    bound = bound_slots(a["name"], a["overload"], a["literals"], a["kwliterals"], len(node.inputs))
    if bound.get("training") is not True:
        return None

    def at(name: str) -> Value | None:
        i = bound.get(name)
        if i is None:
            return None
        v = node.inputs[i] if isinstance(i, int) and not isinstance(i, bool) else None
        return v if isinstance(v, Value) and isinstance(v.type, TensorType) else None

    x, w, b = at("input"), at("weight"), at("bias")
    if x is None or (bound.get("weight") is not None and w is None):
        return None
    if bound.get("bias") is not None and b is None:
        return None
    t = x.type
    assert isinstance(t, TensorType)
    if t.dtype not in DTYPES or t.rank < 2 or not isinstance(t.shape[1], int):
        return None
    if not t.is_static or 0 in t.shape:
        return None
    stats = [o.type for o in node.outputs[1:3]]
    if not all(isinstance(s, TensorType) and s.dtype == torch.float32 for s in stats):
        return None
    return x, w, b


def _emit(b: GraphBuilder, x: Value, w: Value | None, bias: Value | None, node: Node) -> Value:
    """The chain's nodes (appended to ``b``'s graph); its result ``y``."""
    t = x.type
    assert isinstance(t, TensorType)
    f32 = torch.float32

    def wide(v: Value) -> Value:
        assert isinstance(v.type, TensorType)
        return v if v.type.dtype == f32 else b.call("to_dtype", v, dtype=f32)

    def channels(v: Value) -> Value:
        return v if t.rank == 2 else b.call("reshape", v, shape=(t.shape[1],) + (1,) * (t.rank - 2))

    mean, invstd = node.outputs[1], node.outputs[2]
    scale = invstd if w is None else b.call("mul", invstd, wide(w))
    y = b.call("mul", b.call("sub", wide(x), channels(mean)), channels(scale))
    if bias is not None:
        y = b.call("add", y, channels(wide(bias)))
    return y if t.dtype == f32 else b.call("to_dtype", y, dtype=t.dtype)


def with_normalize_chains(graph: Graph, n_forward_nodes: int) -> tuple[Graph, int, list[Chain]]:
    """A copy of the joint graph ``graph`` whose readers of each eligible training batch norm's
    normalized result (among its first ``n_forward_nodes`` nodes) read a chain computing it
    (the module doc), placed right after the batch norm; the copy's count of forward nodes; the
    chains. ``graph`` itself when no batch norm is eligible."""
    found = [n for n in graph.nodes[:n_forward_nodes] if _operands(n) is not None]
    if not found:
        return graph, n_forward_nodes, []
    g = graph.copy()
    b = GraphBuilder.extend(g)
    by_id = {n.id: n for n in g.nodes}
    chains: list[Chain] = []
    added = 0
    for old in found:
        node = by_id[old.id]
        ops = _operands(node)
        assert ops is not None
        y = node.outputs[0]
        start = len(g.nodes)
        made_y = _emit(b, *ops, node)
        made = g.nodes[start:]
        del g.nodes[start:]
        at = g.nodes.index(node) + 1
        g.nodes[at:at] = made
        added += len(made)
        for n in g.nodes:
            if n not in made and any(o is y for o in n.inputs):
                n.inputs = tuple(made_y if o is y else o for o in n.inputs)
        g.outputs = [made_y if o is y else o for o in g.outputs]
        assert made_y.producer is not None
        chains.append(Chain(node.id, made_y.producer.id, frozenset(n.id for n in made)))
    verify(g)
    return g, n_forward_nodes + added, chains


def fold_normalize_chains(forward: Graph, chains: list[Chain]) -> Graph:
    """``forward`` (a partition's forward graph) reading each chain's batch norm's own result 0
    where it read the chain's ``y``, and without the chain nodes nothing reads any more."""
    by_id = {n.id: n for n in forward.nodes}
    swap: dict[int, Value] = {}
    for c in chains:
        last, source = by_id.get(c.last), by_id.get(c.source)
        if last is not None and source is not None:
            swap[id(last.outputs[0])] = source.outputs[0]
    if not swap:
        return forward
    for n in forward.nodes:
        if any(isinstance(o, Value) and id(o) in swap for o in n.inputs):
            n.inputs = tuple(
                swap[id(o)] if isinstance(o, Value) and id(o) in swap else o for o in n.inputs
            )
    forward.outputs = [
        swap[id(o)] if isinstance(o, Value) and id(o) in swap else o for o in forward.outputs
    ]
    ours = frozenset().union(*(c.nodes for c in chains))
    live = {id(o) for o in forward.outputs if isinstance(o, Value)}
    keep: list[Node] = []
    for n in reversed(forward.nodes):
        if n.id not in ours or any(id(v) in live for v in n.outputs):
            keep.append(n)
            live.update(id(v) for v in n.input_values())
    forward.nodes = keep[::-1]
    verify(forward)
    return forward

"""Fuse a training batch norm with the ReLU after it, forward and backward
(:mod:`plait.ir.ops.batch_norm_relu`).

Two rules, each recorded with the node ids it replaced and produced:

- ``fuse-bn-relu.forward``: an ATen training batch norm (``_native_batch_norm_legit_functional``,
  ``_native_batch_norm_legit.no_stats``) whose normalized result is read by one ``relu`` node
  alone (and is no graph output) becomes one ``batch_norm_relu`` node; the relu's readers read
  its result 0, the batch norm's other results keep their readers.
- ``fuse-bn-relu.backward``: ``native_batch_norm_backward`` whose output gradient is
  ``where(le(y, 0), 0.0, g)`` (the ReLU's derivative rule, ``y`` the ReLU's result), a value
  read by that backward alone, becomes one ``batch_norm_relu_backward`` node reading ``g`` and
  ``y``; the comparison goes when nothing else reads it.

The fused ops' references compose the nodes they replace: the pass keeps every bit (``exact``).
Training programs on the Triton target run it on both halves (:mod:`plait.runtime.training`),
where plait's Triton batch-norm kernels apply the ReLU and the mask while they read
(:mod:`plait.codegen.cuda_batch_norm`); it is in no default pipeline.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.passes import run_pipeline
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 3, 5), torch.float32))
    >>> y, mean, rstd = gb.call("aten", [x], name="_native_batch_norm_legit",
    ...                         overload="no_stats",
    ...                         literals='[{"t": 0}, null, null, true, 0.1, 1e-05]')
    >>> gb.output(gb.call("relu", y), mean, rstd)
    >>> result = run_pipeline(gb.build(), "fuse-bn-relu")
    >>> [n.op for n in result.graph.nodes], result.records[0].rewrites[0].rule
    (['batch_norm_relu'], 'fuse-bn-relu.forward')
"""

from __future__ import annotations

import math
from typing import Any

from plait.ir import Graph, Node, Value
from plait.ir.ops.batch_norm_relu import BACKWARD, FORWARD, grad_slot
from plait.passes.manager import EXACT, PassContext, PassRecord, register_pass

FORWARD_RULE, BACKWARD_RULE = "fuse-bn-relu.forward", "fuse-bn-relu.backward"


def _aten(node: Node | None, keys: Any) -> bool:
    return (
        node is not None
        and node.op == "aten"
        and (node.attrs["name"], node.attrs["overload"]) in keys
    )


def _readers(graph: Graph) -> dict[int, int]:
    """How many times each value (by id) is read: operands and graph outputs."""
    counts: dict[int, int] = {}
    for n in graph.nodes:
        for o in n.inputs:
            if isinstance(o, Value):
                counts[id(o)] = counts.get(id(o), 0) + 1
    for o in graph.outputs:
        if isinstance(o, Value):
            counts[id(o)] = counts.get(id(o), 0) + 1
    return counts


def _positive_zero(v: Any) -> bool:
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v == 0
        and math.copysign(1.0, v) > 0
    )


def _replace(
    graph: Graph, gone: list[Node], at: Node, op: str, inputs: tuple[Any, ...], names: list[str]
) -> Node:
    """A node of ``op`` in ``at``'s place, its outputs named ``names`` with ``at``'s types; the
    nodes ``gone`` (``at`` among them) are removed."""
    node = Node(graph.next_node_id(), op, inputs, dict(at.attrs))
    node.outputs = tuple(
        Value(n, v.type, node, i) for i, (n, v) in enumerate(zip(names, at.outputs))
    )
    position = graph.nodes.index(at)
    dropped = {id(n) for n in gone}
    graph.nodes[position] = node
    graph.nodes[:] = [n for n in graph.nodes if id(n) not in dropped or n is node]
    return node


def _redirect(graph: Graph, mapping: dict[int, Value]) -> None:
    for n in graph.nodes:
        if any(isinstance(o, Value) and id(o) in mapping for o in n.inputs):
            n.inputs = tuple(mapping.get(id(o), o) if isinstance(o, Value) else o for o in n.inputs)
    graph.outputs = [mapping.get(id(o), o) if isinstance(o, Value) else o for o in graph.outputs]


def _fuse_forward(graph: Graph, bn: Node, record: PassRecord) -> bool:
    y = bn.outputs[0]
    readers = [n for n in graph.nodes if any(o is y for o in n.inputs)]
    if len(readers) != 1 or _readers(graph).get(id(y), 0) != 1:
        return False  # NOTE: one read, by one node: the normalized result is never stored
    (relu,) = readers
    if relu.op != "relu" or relu.outputs[0].type != y.type:
        return False
    names = [relu.outputs[0].name, *(v.name for v in bn.outputs[1:])]
    old = [relu.outputs[0], *bn.outputs[1:]]
    node = _replace(graph, [bn, relu], bn, "batch_norm_relu", bn.inputs, names)
    _redirect(graph, {id(o): v for o, v in zip(old, node.outputs)})
    record.fired(FORWARD_RULE, [bn.id, relu.id], [node.id])
    return True


def _mask(v: Any) -> tuple[Node, Any, Any] | None:
    """``(where, y, g)`` when ``v`` is ``where(le(y, 0), 0.0, g)``, the ReLU's mask of ``g``."""
    where = v.producer if isinstance(v, Value) else None
    if where is None or where.op != "where":
        return None
    cond, zero, g = where.inputs
    le = cond.producer if isinstance(cond, Value) else None
    if le is None or le.op != "le" or not _positive_zero(zero) or not isinstance(g, Value):
        return None
    y, threshold = le.inputs
    if not isinstance(y, Value) or not _positive_zero(threshold) or isinstance(threshold, Value):
        return None
    if y.type != g.type or where.outputs[0].type != g.type:
        return None
    return where, y, g


def _fuse_backward(graph: Graph, bnb: Node, record: PassRecord) -> bool:
    a = bnb.attrs
    i = grad_slot(a["literals"], a["kwliterals"], len(bnb.inputs))
    found = _mask(bnb.inputs[i])
    if found is None:
        return False
    where, y, g = found
    reads = _readers(graph)
    if reads.get(id(where.outputs[0]), 0) != 1:
        return False  # NOTE: the masked gradient is read by this backward alone
    cond = where.inputs[0]
    assert isinstance(cond, Value) and cond.producer is not None
    le = cond.producer
    gone = [bnb, where] + ([le] if reads.get(id(cond), 0) == 1 else [])
    inputs = (*bnb.inputs[:i], g, *bnb.inputs[i + 1 :], y)
    node = _replace(
        graph, gone, bnb, "batch_norm_relu_backward", inputs, [v.name for v in bnb.outputs]
    )
    _redirect(graph, {id(o): v for o, v in zip(bnb.outputs, node.outputs)})
    record.fired(BACKWARD_RULE, [n.id for n in gone], [node.id])
    return True


@register_pass("fuse-bn-relu", EXACT, rules=(FORWARD_RULE, BACKWARD_RULE))
def fuse_bn_relu(graph: Graph, ctx: PassContext) -> Graph:
    """ATen training batch norm + the relu that alone reads its result → batch_norm_relu;
    native_batch_norm_backward of the relu's mask of a gradient (read there alone) →
    batch_norm_relu_backward."""
    for node in list(graph.nodes):
        if _aten(node, FORWARD):
            _fuse_forward(graph, node, ctx.record)
        elif _aten(node, {BACKWARD}):
            _fuse_backward(graph, node, ctx.record)
    return graph

"""The joint forward+backward graph: a captured graph extended with its reverse-mode derivative.

:func:`build_joint` copies the forward graph, adds one cotangent input per differentiable output
that depends on a differentiated input, and walks the forward nodes in reverse, calling each op's
derivative rule (:mod:`plait.ir.ops.vjp`) and summing the gradients of values read more than once.
The joint graph returns the forward's outputs, then one gradient per differentiated input that a
gradient reaches (``Joint.grads`` says which).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float64))
    >>> b.output(b.call("mul", x, x))
    >>> j = build_joint(b.build(), wrt=["x"])
    >>> j.cotangents, j.grads, len(j.graph.outputs)
    ([0], [0], 2)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from plait.errors import PlaitCompileError
from plait.ir.builder import GraphBuilder
from plait.ir.graph import Graph, Node, Value
from plait.ir.ops.aten import mixed_batch_norm
from plait.ir.ops.pooling import max_pool_window
from plait.ir.ops.vjp import (
    NoDerivativeError,
    VjpContext,
    has_rule,
    is_differentiable,
    is_empty,
    vjp_rule,
)
from plait.ir.types import FLOAT_DTYPES, TensorType
from plait.ir.verify import verify


class JointGraphError(PlaitCompileError, ValueError):
    """The forward graph cannot be differentiated as asked."""

    error_code = "PLAIT-C120"


@dataclass
class Joint:
    """``graph``: the forward inputs then one cotangent input per entry of ``cotangents``; the
    forward outputs (``n_outputs`` of them) then one gradient per entry of ``grads``.
    ``cotangents``: the forward output indices that take a cotangent. ``grads``: the forward
    input indices whose gradient the graph returns. ``n_forward_nodes``: the joint graph's first
    nodes are the forward's, in its order. ``reaches``: per entry of ``grads``, the positions in
    ``cotangents`` of the outputs a differentiable path from that input reaches (eager's autograd
    graph): when none of them takes a gradient in a backward, the input's gradient is None, as
    in eager (never zeros, which an optimizer would step on)."""

    graph: Graph
    n_inputs: int
    n_outputs: int
    n_forward_nodes: int
    cotangents: list[int]
    grads: list[int]
    reaches: list[list[int]]


def _floating(v: Value) -> bool:
    """A value a gradient can flow into: a floating or a complex tensor (eager's autograd
    differentiates both; :func:`_refuse_complex` names the second)."""
    return isinstance(v.type, TensorType) and (
        v.type.dtype in FLOAT_DTYPES or v.type.dtype.is_complex
    )


def _refuse_complex(v: Any, where: str) -> None:
    """Raises :class:`JointGraphError` when a gradient would flow into ``v`` and ``v`` is
    complex: the derivative rules are real (eager's complex gradients take the conjugate
    Wirtinger convention), so the call falls back to eager autograd instead of dropping or
    misreading the gradient."""
    if isinstance(v, Value) and isinstance(v.type, TensorType) and v.type.dtype.is_complex:
        raise JointGraphError(
            f"a gradient flows into the complex value %{v.name} ({where}): compiled backwards "
            "differentiate real values only"
        )


def active_values(graph: Graph, wrt: set[str]) -> set[int]:
    """ids of the values a gradient can flow into from the inputs named in ``wrt``."""
    active = {id(v) for v in graph.inputs if v.name in wrt and _floating(v)}
    for node in graph.nodes:
        if not any(id(v) in active for v in node.input_values()):
            continue
        if not has_rule(node.op):
            raise JointGraphError(
                f"a gradient flows into node {node.id} ({node.op}), and {node.op} has no "
                "derivative rule (plait.ir.ops.vjp)"
            )
        if is_differentiable(node.op):
            active.update(id(v) for v in node.outputs if _floating(v))
    return active


def input_sources(graph: Graph, wrt: set[str]) -> dict[int, frozenset[int]]:
    """Per active value (by id), the indices of the inputs named in ``wrt`` a differentiable
    path reaches it from: the edges of eager's autograd graph (as :func:`active_values` walks)."""
    sources = {
        id(v): frozenset([i]) for i, v in enumerate(graph.inputs) if v.name in wrt and _floating(v)
    }
    for node in graph.nodes:
        found = [sources[id(v)] for v in node.input_values() if id(v) in sources]
        if not found or not is_differentiable(node.op):
            continue
        union = frozenset().union(*found)
        sources.update((id(v), union) for v in node.outputs if _floating(v))
    return sources


def prepare_for_autograd(graph: Graph, wrt: set[str]) -> Graph:
    """``graph`` with the nodes whose derivative needs more than their result made explicit:
    a train-mode dropout a gradient flows through becomes ATen's ``native_dropout`` (its mask
    is an output the backward reads; it draws the same numbers, see the dropout rule)."""
    active = active_values(graph, wrt)

    def reached(n: Node) -> bool:
        return any(id(v) in active for v in n.input_values())

    targets = [
        n
        for n in graph.nodes
        if reached(n)
        and (
            (n.op == "dropout" and n.attrs["train"] and 0 < n.attrs["p"] < 1)
            or (n.op == "max_pool2d" and not is_empty(n.inputs[0]))
            or (n.op == "batch_norm_train" and _typed_as_meta(n) and not is_empty(n.inputs[0]))
            or (n.op == "scaled_dot_product_attention" and _cpu_attention(n, active))
        )
    ]  # NOTE: a p=1 dropout draws nothing in eager (its rule zeroes the gradient); ATen's
    # max_pool2d_with_indices and functional batch norm refuse an empty input
    if not targets:
        return graph
    g = graph.copy()
    b = GraphBuilder.extend(g)
    by_id = {n.id: n for n in g.nodes}
    for old in targets:
        node = by_id[old.id]
        start = len(g.nodes)
        results = _rewrite(node, active)(b, node)
        # NOTE: the nodes appended last take the node's place; the first takes its id
        made = g.nodes[start:]
        del g.nodes[start:]
        made[0].id = node.id
        at = g.nodes.index(node)
        g.nodes[at : at + 1] = made
        for was, now in zip(node.outputs, results):
            replace_uses(g, was, now)
    verify(g)
    return g


_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _typed_as_meta(n: Node) -> bool:
    """Whether ATen's training batch norm returns the types its meta kernel says (the IR node
    is typed from it): a float32 or float64 input; or a 16-bit input with float32 weight, bias
    or running statistics (autocast's mixed case: float32 statistics, on the CPU and CUDA). A
    16-bit input with only 16-bit (or no) affine and running tensors gets 16-bit statistics
    from the CPU kernel where the meta kernel says float32: the ``batch_norm_train`` rule's."""
    x = n.inputs[0]
    if not (isinstance(x, Value) and isinstance(x.type, TensorType)):
        return False
    others = [v.type for v in n.inputs[1:] if isinstance(v, Value)]
    return x.type.dtype in (torch.float32, torch.float64) or mixed_batch_norm(x.type, others)


def _cpu_attention(n: Node, active: set[int]) -> bool:
    """CPU attention without grouped heads: with dropout, eager's math path (its dropout mask
    drawn as eager draws it, see _attention_math_call); without, ATen's CPU flash kernel."""
    if n.attrs["dropout_p"] > 0:
        q = n.inputs[0]
        assert isinstance(q, Value) and isinstance(q.type, TensorType)
        return q.type.device == "cpu" and not n.attrs["enable_gqa"] and q.type.is_static
    return _cpu_flash_attention(n, active)


def _cpu_flash_attention(n: Node, active: set[int]) -> bool:
    """Attention eager runs as ATen's CPU flash kernel, whose backward reads the forward's
    log-sum-exp: CPU tensors of rank 4, no dropout, no grouped heads, a mask (if any) of the
    query's dtype that no gradient flows into, and the flash backend enabled."""
    q, mask = n.inputs[0], n.inputs[3] if len(n.inputs) > 3 else None
    assert isinstance(q, Value) and isinstance(q.type, TensorType)
    if q.type.device != "cpu" or q.type.rank != 4 or q.type.dtype not in _FLASH_DTYPES:
        return False
    if not torch._C._get_flash_sdp_enabled():
        return False  # NOTE: eager runs its math path then (the setting is a guarded one)
    if not _eager_picks_flash(n):
        return False
    if n.attrs["dropout_p"] != 0.0 or n.attrs["enable_gqa"]:
        return False
    if isinstance(mask, Value):
        if id(mask) in active or not isinstance(mask.type, TensorType):
            return False
        if mask.type.dtype != q.type.dtype or mask.type.rank != 4:
            return False
    return True


def _eager_picks_flash(n: Node) -> bool:
    """Whether ATen's own backend choice (``torch._fused_sdp_choice``) for tensors of the
    node's shapes and dtypes, last dims dense, is its flash kernel: not for an empty sequence
    (where the flash kernel divides by zero), nor for a value head dim other than the query's.
    A symbolic shape asks for equal head dims only (sizes 0 and 1 specialize at capture)."""
    q, k, v = n.inputs[:3]
    types = [x.type for x in (q, k, v) if isinstance(x, Value) and isinstance(x.type, TensorType)]
    if len(types) != 3:
        return False
    if not all(t.is_static for t in types):
        return len({str(t.shape[-1]) for t in types}) == 1

    def fake(t: TensorType) -> torch.Tensor:
        # NOTE: ATen's checks read shapes, dtypes and the last stride, never the values
        shape = tuple(int(d) for d in t.shape)
        row = torch.empty(max(shape[-1], 1), dtype=t.dtype)
        return row.as_strided(shape, (0,) * (len(shape) - 1) + (1,))

    a = n.attrs
    q_, k_, v_ = (fake(t) for t in types)
    choice = torch._fused_sdp_choice(
        q_, k_, v_, attn_mask=None, dropout_p=0.0, is_causal=bool(a["is_causal"]), scale=a["scale"]
    )
    return int(choice) == int(SDPBackend.FLASH_ATTENTION.value)


def _attention_call(b: GraphBuilder, node: Node) -> list[Value]:
    """ATen's CPU flash attention: eager's kernel (bitwise), and the log-sum-exp its backward
    kernel reads."""
    q, k, v, *rest = node.inputs
    mask = rest[0] if rest else None
    tensors = [q, k, v] + ([mask] if isinstance(mask, Value) else [])
    keywords = {"attn_mask": {"t": 3} if isinstance(mask, Value) else None}
    keywords["scale"] = node.attrs["scale"]
    out = b.call(
        "aten",
        tensors,
        name="_scaled_dot_product_flash_attention_for_cpu",
        overload="default",
        literals=json.dumps([{"t": 0}, {"t": 1}, {"t": 2}, 0.0, node.attrs["is_causal"]]),
        kwliterals=json.dumps(keywords),
    )
    return [out[0]]


def _attention_math_call(b: GraphBuilder, node: Node) -> list[Value]:
    """Attention with dropout as eager computes it on the CPU (its math path): scores, mask,
    safe softmax, ATen's native_dropout on the weights (the numbers eager's dropout draws), then the
    product with the values; every step has a derivative rule."""
    q, k, v, *rest = node.inputs
    mask = rest[0] if rest else None
    assert isinstance(q, Value) and isinstance(q.type, TensorType)
    assert isinstance(k, Value) and isinstance(k.type, TensorType)
    a = node.attrs
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(int(q.type.shape[-1]))
    scores = b.call("mul", b.call("matmul", q, b.call("transpose", k, dim0=-2, dim1=-1)), scale)
    big = float("-inf")
    if a["is_causal"]:
        length, span = int(q.type.shape[-2]), int(k.type.shape[-2])
        ones = b.call("ones", shape=(length, span), dtype=q.type.dtype, device=q.type.device)
        keep = b.call("gt", b.call("tril", ones), 0.0)
        scores = b.call("where", keep, scores, big)
    if isinstance(mask, Value) and isinstance(mask.type, TensorType):
        if mask.type.dtype == torch.bool:
            scores = b.call("where", mask, scores, big)
        else:
            scores = b.call("add", scores, mask)
    # NOTE: eager's _safe_softmax: a row every key of which is masked out (a padded query
    # under a causal and padding mask) weighs nothing, where a plain softmax gives NaN; its
    # scores are made finite first, so that the softmax's derivative reads no NaN either
    masked = b.call("all", b.call("eq", scores, big), dims=[-1], keepdim=True)
    weights = b.call("softmax", b.call("where", masked, 0.0, scores), dim=-1)
    weights = b.call("where", masked, 0.0, weights)
    return [b.call("matmul", _native_dropout(b, weights, a["dropout_p"]), v)]


def _max_pool_call(b: GraphBuilder, node: Node) -> list[Value]:
    """ATen's max_pool2d_with_indices: eager's kernel, and the indices its backward reads."""
    out, _indices = b.call(
        "aten",
        [node.inputs[0]],
        name="max_pool2d_with_indices",
        overload="default",
        literals=json.dumps([{"t": 0}, *max_pool_window(node.attrs)]),
    )
    return [out]


def _dropout_call(b: GraphBuilder, node: Node) -> list[Value]:
    x = node.inputs[0]
    assert isinstance(x, Value)
    return [_native_dropout(b, x, node.attrs["p"])]


def _native_dropout(b: GraphBuilder, x: Value, p: float) -> Value:
    """``native_dropout(x, p, True)``'s result: the same draws as eager's dropout; its mask
    (the node's second result) is what the backward reads."""
    y, _mask = b.call(
        "aten",
        [x],
        name="native_dropout",
        overload="default",
        literals=json.dumps([{"t": 0}, p, True]),
    )
    return y


def _batch_norm_call(b: GraphBuilder, node: Node) -> list[Value]:
    """ATen's functional training batch norm: eager's kernel (bitwise), and the batch mean and
    inverse standard deviation its backward reads; the running statistics as results."""
    tensors = [o for o in node.inputs if isinstance(o, Value)]
    refs: list[object] = []
    for o in node.inputs:
        refs.append({"t": tensors.index(o)} if isinstance(o, Value) else None)
    x, w, bias, rm, rv = refs
    momentum, eps = node.attrs["momentum"], node.attrs["eps"]
    if rm is None:
        out = b.call(
            "aten",
            tensors,
            name="_native_batch_norm_legit",
            overload="no_stats",
            literals=json.dumps([x, w, bias, True, momentum, eps]),
        )
        return [out[0]]
    out = b.call(
        "aten",
        tensors,
        name="_native_batch_norm_legit_functional",
        overload="default",
        literals=json.dumps([x, w, bias, rm, rv, True, momentum, eps]),
    )
    return [out[0], out[3], out[4]]


_REWRITES = {
    "dropout": _dropout_call,
    "batch_norm_train": _batch_norm_call,
    "scaled_dot_product_attention": _attention_call,
    "max_pool2d": _max_pool_call,
}


def _rewrite(node: Node, active: set[int]) -> Any:
    if node.op == "scaled_dot_product_attention" and node.attrs["dropout_p"] > 0:
        return _attention_math_call
    return _REWRITES[node.op]


def replace_uses(g: Graph, old: Value, new: Value) -> None:
    """Every read of ``old`` (operands and outputs) reads ``new`` instead."""
    for n in g.nodes:
        if any(o is old for o in n.inputs):
            n.inputs = tuple(new if o is old else o for o in n.inputs)
    g.outputs = [new if o is old else o for o in g.outputs]


def build_joint(
    forward: Graph, wrt: Sequence[str], differentiable_outputs: Sequence[int] | None = None
) -> Joint:
    """The joint graph of ``forward`` differentiated with respect to the inputs named in ``wrt``.

    ``differentiable_outputs`` (default: all) lists the forward outputs that may take a cotangent;
    a buffer update written back after the call is not one.
    """
    names = {v.name for v in forward.inputs}
    unknown = sorted(set(wrt) - names)
    if unknown:
        raise JointGraphError(f"no graph input named {unknown}")
    g = forward.copy()
    b = GraphBuilder.extend(g)
    n_nodes, n_inputs = len(g.nodes), len(g.inputs)
    outputs = list(g.outputs)
    active = active_values(g, set(wrt))
    allowed = range(len(outputs)) if differentiable_outputs is None else differentiable_outputs
    grads: dict[int, Value] = {}
    cotangents: list[int] = []
    for i in allowed:
        o = outputs[i]
        if isinstance(o, Value) and id(o) in active:
            _refuse_complex(o, f"output {i}")
            cot = b.input(f"cotangent_{i}", o.type)
            cotangents.append(i)
            _accumulate(b, grads, o, cot)
    for node in reversed(g.nodes[:n_nodes]):
        _backward_of(b, node, grads, active)
    returned: list[int] = []
    for i, v in enumerate(g.inputs[:n_inputs]):
        if v.name in wrt and id(v) in grads:
            returned.append(i)
            outputs.append(grads[id(v)])
    g.outputs = outputs
    verify(g)
    sources = input_sources(forward, set(wrt))
    reaches = [
        [k for k, o in enumerate(cotangents) if i in sources.get(id(forward.outputs[o]), ())]
        for i in returned
    ]
    return Joint(g, n_inputs, len(forward.outputs), n_nodes, cotangents, returned, reaches)


def _backward_of(b: GraphBuilder, node: Node, grads: dict[int, Value], active: set[int]) -> None:
    outs = [grads.get(id(v)) for v in node.outputs]
    if all(o is None for o in outs):
        return
    needs = [isinstance(o, Value) and id(o) in active for o in node.inputs]
    if not any(needs):
        return
    for operand, need in zip(node.inputs, needs):
        if need:
            _refuse_complex(operand, f"operand of node {node.id} ({node.op})")
    rule = vjp_rule(node.op)
    if rule is None:
        return
    try:
        found = rule(VjpContext(b, node, outs, needs))
    except NoDerivativeError as exc:
        raise JointGraphError(f"node {node.id} ({node.op}): {exc}") from exc
    if len(found) != len(node.inputs):
        raise JointGraphError(
            f"the derivative rule of {node.op} gave {len(found)} gradients for "
            f"{len(node.inputs)} operands"
        )
    for operand, need, grad in zip(node.inputs, needs, found):
        if need and grad is not None:
            assert isinstance(operand, Value) and isinstance(grad, Value)
            if grad.type != operand.type:
                raise JointGraphError(
                    f"the derivative rule of {node.op} gave {grad.type} for operand "
                    f"%{operand.name} of type {operand.type}"
                )
            _accumulate(b, grads, operand, grad)


def _accumulate(b: GraphBuilder, grads: dict[int, Value], v: Value, g: Value) -> None:
    prev = grads.get(id(v))
    grads[id(v)] = g if prev is None else b.call("add", prev, g)

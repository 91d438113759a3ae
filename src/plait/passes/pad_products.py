"""Zero-padded operands of 16-bit CUDA matrix products as graph values, one per source.

A 16-bit CUDA ``linear`` or ``matmul`` with a dimension that is not a multiple of 8 runs a slow
cuBLAS kernel; the runtime pads its operands at every call (:mod:`plait.codegen.cuda_padding`),
each product its own copy. A language-model head's two gradient products both read the
cotangent of the logits (``dY @ W`` pads its last dimension as K, ``dY^T @ X`` the same
dimension as the rows of the transposed operand): two strided copies of the largest tensor of
the step. This pass writes the padding into the graph instead:

- ``pad-products.operands``: the product reads ``constant_pad`` values (zeros), rounded up to
  multiples of 8 in each misaligned dimension, and its result is ``slice``d back to the real
  size. A padded value is made once per (source value, dimension, size) and shared by every
  product that reads it; a view chain between the source and the product (a ``reshape`` that
  keeps the last dimension, a ``permute`` or ``transpose``) is replayed on the padded source, so
  both gradient products read one padded cotangent. The pad is an elementwise select that the
  Triton fusion writes where the value is made (no separate copy).

Declined (the runtime padding applies as before): a product whose result would be sliced and
is read by a graph output (the slice would be materialized and copied out again, where the
runtime returns a view), and rows of a 2-d operand that is not a transposed view (its rows are
no leading dimension). The padding adds products of zeros only (a NaN or infinity reaches the
outputs it reaches unpadded), summed in another order: ``contract``.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.passes import run_pipeline
    >>> bf = torch.bfloat16
    >>> gb = GraphBuilder()
    >>> dy = gb.input("dy", TensorType((16, 1001), bf, "cuda:0"))
    >>> w = gb.input("w", TensorType((1001, 64), bf, "cuda:0"))
    >>> x = gb.input("x", TensorType((16, 64), bf, "cuda:0"))
    >>> dw = gb.call("matmul", gb.call("permute", dy, dims=[1, 0]), x)
    >>> gb.output(gb.call("matmul", dy, w), gb.call("mul", dw, 2.0))
    >>> g = run_pipeline(gb.build(), "pad-products,dce").graph
    >>> [n.op for n in g.nodes]  # dy padded once for both products, w once
    ['constant_pad', 'permute', 'matmul', 'slice', 'constant_pad', 'matmul', 'mul']
"""

from __future__ import annotations

from typing import Any

from plait.ir import Graph, Node, Value
from plait.ir.types import TensorType
from plait.passes.manager import CONTRACT, PassContext, register_pass
from plait.passes.product_alignment import ALIGN, dims_of, misaligned
from plait.passes.rewrite import Emitter, replace_uses

RULE = "pad-products.operands"
_VIEWS_THROUGH = ("permute", "transpose", "reshape", "view")


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _rank(v: Any) -> int:
    assert isinstance(v, Value) and isinstance(v.type, TensorType)
    return v.type.rank


def _size(v: Value, d: int) -> int:
    assert isinstance(v.type, TensorType)
    return int(v.type.shape[d])


def _transposed(v: Any) -> bool:
    """Whether ``v`` (2-d) is a transposed view: its rows are a leading dimension."""
    p = v.producer if isinstance(v, Value) else None
    if p is None or _rank(v) != 2:
        return False
    if p.op == "permute":
        return list(p.attrs["dims"]) == [1, 0]
    return p.op == "transpose" and {p.attrs["dim0"] % 2, p.attrs["dim1"] % 2} == {0, 1}


class _Padder:
    """Makes padded values; one per (source value, dimension, size), shared."""

    def __init__(self, graph: Graph) -> None:
        self.emit = Emitter(graph, graph.next_node_id())
        self.made: dict[tuple[int, int, int], Value] = {}

    def padded(self, v: Value, d: int, size: int) -> Value:
        """``v`` zero-padded along ``d`` to ``size``: through the views above it when the
        padded dimension is one of their source's, so that sources are padded once."""
        key = (id(v), d, size)
        if key not in self.made:
            self.made[key] = self._make(v, d, size)
        return self.made[key]

    def _make(self, v: Value, d: int, size: int) -> Value:
        p = v.producer
        rank = _rank(v)
        if p is not None and p.op in _VIEWS_THROUGH and isinstance(p.inputs[0], Value):
            src = p.inputs[0]
            if p.op == "permute":
                dims = [int(k) % rank for k in p.attrs["dims"]]
                return self.emit("permute", self.padded(src, dims[d], size), dims=dims)
            if p.op == "transpose":
                a, b = p.attrs["dim0"] % rank, p.attrs["dim1"] % rank
                s = b if d == a else a if d == b else d
                return self.emit("transpose", self.padded(src, s, size), dim0=a, dim1=b)
            last = _rank(src) - 1
            if d == rank - 1 and _size(src, last) == _size(v, d):
                shape = [_size(v, k) for k in range(rank - 1)] + [size]
                return self.emit("reshape", self.padded(src, last, size), shape=shape)
        pad = [0, 0] * (rank - 1 - d) + [0, size - _size(v, d)]
        return self.emit("constant_pad", v, pad=pad, value=0)


def _read_by_outputs(graph: Graph, v: Value) -> bool:
    return any(o is v for o in graph.outputs)


def _rewrite(graph: Graph, node: Node, padder: _Padder) -> Value | None:
    """The padded product's (sliced) result, or None where the node is declined."""
    dims = dims_of(node)
    if dims is None:
        return None
    m, k, n = dims
    x, w = node.inputs[0], node.inputs[1]
    assert isinstance(x, Value) and isinstance(w, Value)
    pad_k, pad_n = k % ALIGN != 0, n % ALIGN != 0
    pad_m = node.op == "matmul" and _rank(x) == 2 and m % ALIGN != 0 and _transposed(x)
    if not (pad_k or pad_n or pad_m):
        return None  # NOTE: rows of a row-major operand: no leading dimension to align
    if (pad_n or pad_m) and _read_by_outputs(graph, node.outputs[0]):
        return None
    rx = _rank(x)
    kp, np_ = _up(k), _up(n)
    if pad_k:
        x = padder.padded(x, rx - 1, kp)
    if pad_m:
        x = padder.padded(x, 0, _up(m))
    emit = padder.emit
    if node.op == "linear":
        b = node.inputs[2] if len(node.inputs) > 2 else None
        if pad_k:
            w = padder.padded(w, 1, kp)
        if pad_n:
            w = padder.padded(w, 0, np_)
            if isinstance(b, Value):
                b = padder.padded(b, 0, np_)
        out = emit("linear", x, w, b, **node.attrs)
    else:
        if pad_k:
            w = padder.padded(w, 0, kp)
        if pad_n:
            w = padder.padded(w, 1, np_)
        out = emit("matmul", x, w, **node.attrs)
    r = _rank(out)
    if pad_n:
        out = emit("slice", out, dim=r - 1, start=0, end=n, step=1)
    if pad_m:
        out = emit("slice", out, dim=r - 2, start=0, end=m, step=1)
    return out


@register_pass("pad-products", CONTRACT, rules=(RULE,))
def pad_products(graph: Graph, ctx: PassContext) -> Graph:
    """16-bit CUDA products with a dimension not a multiple of 8 → the product of zero-padded
    operands (one padded value per source and dimension, shared), sliced back."""
    padder = _Padder(graph)
    for node in list(graph.nodes):
        if not misaligned(node):
            continue
        before = len(padder.emit.nodes)
        out = _rewrite(graph, node, padder)
        if out is None:
            continue
        made = padder.emit.nodes[before:]
        at = graph.nodes.index(node)
        graph.nodes[at : at + 1] = made
        replace_uses(graph, {id(node.outputs[0]): out}, at)
        ctx.record.fired(RULE, [node.id], [n.id for n in made])
    return graph

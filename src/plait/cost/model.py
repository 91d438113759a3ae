"""A per-node cost estimate: floating-point operations and bytes moved.

The estimate is a roofline model's inputs, read off the IR alone (types and attributes): a
pointwise node costs one operation per output element (a transcendental, a few) and moves its
operands and result once; a reduction reads its operand once; a view moves nothing (index
arithmetic); convolutions, linears, matmuls and attention count their multiply-adds. It ignores
fusion (which saves bytes) and kernel quality: it says what a node has to do, not how fast a
backend does it.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((8, 16), torch.float32))
    >>> w = gb.input("w", TensorType((4, 16), torch.float32))
    >>> gb.output(gb.call("relu", gb.call("linear", x, w)))
    >>> cost = estimate(gb.build())
    >>> cost.total.flops, cost.total.bytes
    (1056, 1152)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from plait.ir import Category, Graph, Node, TensorType, Value, get_op

# NOTE: operations per element of the transcendental pointwise ops (a libm call costs several)
_TRANSCENDENTAL = {
    "exp": 8, "exp2": 8, "expm1": 8, "log": 8, "log2": 8, "log10": 8, "log1p": 8, "sin": 8,
    "cos": 8, "tan": 8, "sinh": 8, "cosh": 8, "tanh": 8, "asin": 8, "acos": 8, "atan": 8,
    "asinh": 8, "acosh": 8, "atanh": 8, "atan2": 8, "erf": 8, "erfc": 8, "sigmoid": 8,
    "silu": 9, "gelu": 10, "mish": 16, "softplus": 16, "logsigmoid": 16, "pow": 8, "sqrt": 2,
    "rsqrt": 2, "xlogy": 9, "hypot": 4, "elu": 9,
}  # fmt: skip
# NOTE: operations per input element of the normalizations (statistics, then the affine map)
_NORMALIZATION = {"softmax": 5, "log_softmax": 5, "logsumexp": 5, "layer_norm": 8,
                  "group_norm": 8, "batch_norm": 4, "batch_norm_train": 8, "var": 3}  # fmt: skip


@dataclass(frozen=True)
class Cost:
    """Floating-point (or integer) operations and bytes moved (read plus written)."""

    flops: int = 0
    bytes: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    @property
    def intensity(self) -> float:
        """Operations per byte moved (a roofline's x axis)."""
        return self.flops / self.bytes if self.bytes else math.inf


@dataclass
class GraphCost:
    """Per node (by id) and in total; ``unknown`` lists nodes with symbolic shapes (not
    counted)."""

    nodes: dict[int, Cost] = field(default_factory=dict)
    ops: dict[int, str] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)

    @property
    def total(self) -> Cost:
        out = Cost()
        for c in self.nodes.values():
            out = out + c
        return out

    def records(self) -> dict[str, Any]:
        """The manifest's view: totals, and each node's estimate."""
        total = self.total
        return {
            "model": "plait.cost/1",
            "flops": total.flops,
            "bytes": total.bytes,
            "nodes": [
                {"id": n, "op": self.ops[n], "flops": c.flops, "bytes": c.bytes}
                for n, c in sorted(self.nodes.items())
            ],
            "unknown": list(self.unknown),
        }


def _numel(v: Value | Any) -> int | None:
    t = v.type if isinstance(v, Value) else None
    if not isinstance(t, TensorType):
        return 0
    if not t.is_static:
        return None
    return math.prod(int(d) for d in t.shape)


def _nbytes(v: Value) -> int | None:
    n = _numel(v)
    if n is None:
        return None
    t = v.type
    return n * t.dtype.itemsize if isinstance(t, TensorType) else 0


def node_cost(node: Node) -> Cost | None:
    """The estimate for one node (None when a shape is symbolic)."""
    ins = list(node.input_values())
    outs = list(node.outputs)
    sizes = [_nbytes(v) for v in [*ins, *outs]]
    counts = [_numel(v) for v in outs]
    if any(s is None for s in sizes) or any(c is None for c in counts):
        return None
    moved = sum(s for s in sizes if s is not None)
    out_elems = sum(c for c in counts if c is not None)
    category = get_op(node.op).category
    if category in (Category.VIEW, Category.CONSTANT):
        # NOTE: a view is index arithmetic; a copy (contiguous, cat, pad) moves its result
        copies = node.op in ("contiguous", "cat", "stack", "pad", "constant_pad", "flip", "roll")
        written = sum(_nbytes(v) or 0 for v in outs)
        return Cost(0, 2 * written if copies else 0)
    if node.op in _NORMALIZATION:
        n_in = _numel(ins[0]) or 0
        return Cost(_NORMALIZATION[node.op] * n_in, moved)
    if category is Category.REDUCTION:
        return Cost(_numel(ins[0]) or 0, moved)
    if category is Category.POINTWISE:
        return Cost(_TRANSCENDENTAL.get(node.op, 1) * out_elems, moved)
    return Cost(_extern_flops(node, ins, out_elems), moved)


def _extern_flops(node: Node, ins: list[Value], out_elems: int) -> int:
    def shape(v: Value) -> tuple[int, ...]:
        t = v.type
        assert isinstance(t, TensorType)
        return tuple(int(d) for d in t.shape)

    if node.op == "conv2d":
        w = shape(ins[1])  # NOTE: (out, in / groups, kh, kw): 2 per multiply-add
        return 2 * out_elems * w[1] * w[2] * w[3]
    if node.op in ("linear", "matmul", "bmm"):
        return 2 * out_elems * shape(ins[0])[-1]
    if node.op == "scaled_dot_product_attention":
        q, k = shape(ins[0]), shape(ins[1])
        scores = math.prod(q[:-1]) * k[-2]
        return 2 * scores * q[-1] * 2 + 5 * scores  # NOTE: QK^T, PV, and the softmax
    if node.op in ("max_pool2d", "avg_pool2d"):
        k = node.attrs.get("kernel_size", (1, 1))
        return out_elems * math.prod(int(x) for x in k)
    if node.op == "adaptive_avg_pool2d":
        return _numel(ins[0]) or 0
    return out_elems  # NOTE: gathers and ATen calls: one operation per result element


def estimate(graph: Graph) -> GraphCost:
    """The cost estimate of every node of ``graph``."""
    out = GraphCost()
    for node in graph.nodes:
        cost = node_cost(node)
        if cost is None:
            out.unknown.append(node.id)
            continue
        out.nodes[node.id] = cost
        out.ops[node.id] = node.op
    return out

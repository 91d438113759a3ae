"""Table-driven decomposition of composite ops into primitives, for stages that want them.

Each entry maps an op to a function ``(emit, node) -> outputs`` (or ``None`` to keep the node).
16-bit float inputs are computed in float32 and rounded back once, as PyTorch's own kernels do
(the numerical contract's accumulation dtype for them). Option ``ops`` limits which ops decompose.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from plait.errors import InvalidOptionError, SemanticDriftError
from plait.ir import Graph, Node, TensorType, Value
from plait.passes.manager import CONTRACT, PassContext, register_pass
from plait.passes.rewrite import Emitter, replace_uses

Emit = Callable[..., Any]
_LOW = (torch.float16, torch.bfloat16)


def _t(v: Any) -> TensorType:
    assert isinstance(v, Value) and isinstance(v.type, TensorType)
    return v.type


def _up(emit: Emit, x: Any) -> Any:
    return emit("to_dtype", x, dtype=torch.float32) if x is not None and _t(x).dtype in _LOW else x


def _down(emit: Emit, y: Any, dtype: torch.dtype) -> Any:
    return emit("to_dtype", y, dtype=dtype) if dtype in _LOW else y


def _gelu(emit: Emit, n: Node) -> Any:
    x = n.inputs[0]
    dtype = _t(x).dtype
    x = _up(emit, x)
    if n.attrs["approximate"] == "tanh":
        inner = emit(
            "mul", emit("add", x, emit("mul", emit("pow", x, 3), 0.044715)), math.sqrt(2 / math.pi)
        )
        y = emit("mul", emit("mul", x, 0.5), emit("add", emit("tanh", inner), 1))
    else:
        y = emit(
            "mul",
            emit("mul", x, 0.5),
            emit("add", emit("erf", emit("mul", x, 1 / math.sqrt(2))), 1),
        )
    return _down(emit, y, dtype)


def _silu(emit: Emit, n: Node) -> Any:
    x = n.inputs[0]
    dtype = _t(x).dtype
    x = _up(emit, x)
    return _down(emit, emit("mul", x, emit("sigmoid", x)), dtype)


def _softmax(emit: Emit, n: Node) -> Any:
    x, dim = n.inputs[0], n.attrs["dim"]
    out_dtype = n.attrs["dtype"] or _t(x).dtype
    if n.attrs["dtype"] is not None:
        x = emit("to_dtype", x, dtype=n.attrs["dtype"])
    if 0 in _t(x).shape:
        return None
    x = _up(emit, x)
    shifted = emit("sub", x, emit("amax", x, dims=(dim,), keepdim=True))
    if n.op == "softmax":
        e = emit("exp", shifted)
        y = emit("div", e, emit("sum", e, dims=(dim,), keepdim=True))
    else:
        lse = emit("log", emit("sum", emit("exp", shifted), dims=(dim,), keepdim=True))
        y = emit("sub", shifted, lse)
    return _down(emit, y, out_dtype)


def _normalize(emit: Emit, x: Any, dims: tuple[int, ...], eps: float) -> Any:
    mean = emit("mean", x, dims=dims, keepdim=True)
    var = emit("var", x, dims=dims, correction=0, keepdim=True)
    return emit("mul", emit("sub", x, mean), emit("rsqrt", emit("add", var, eps)))


def _layer_norm(emit: Emit, n: Node) -> Any:
    x, w, b = n.inputs
    dtype, rank = _t(x).dtype, _t(x).rank
    if 0 in _t(x).shape:
        return None
    k = len(n.attrs["normalized_shape"])
    y = _normalize(emit, _up(emit, x), tuple(range(rank - k, rank)), n.attrs["eps"])
    if w is not None:
        y = emit("mul", y, _up(emit, w))
    if b is not None:
        y = emit("add", y, _up(emit, b))
    return _down(emit, y, dtype)


def _channel(emit: Emit, p: Any, rank: int) -> Any:
    """A per-channel (C,) parameter reshaped to broadcast over (N, C, ...)."""
    c = _t(p).shape[0]
    return emit("reshape", _up(emit, p), shape=(1, c) + (1,) * (rank - 2))


def _affine(emit: Emit, y: Any, w: Any, b: Any, rank: int) -> Any:
    if w is not None:
        y = emit("mul", y, _channel(emit, w, rank))
    if b is not None:
        y = emit("add", y, _channel(emit, b, rank))
    return y


def _batch_norm(emit: Emit, n: Node) -> Any:
    x, w, b, rm, rv = n.inputs
    dtype, rank = _t(x).dtype, _t(x).rank
    xf = _up(emit, x)
    inv = emit("rsqrt", emit("add", _channel(emit, rv, rank), n.attrs["eps"]))
    y = emit("mul", emit("sub", xf, _channel(emit, rm, rank)), inv)
    return _down(emit, _affine(emit, y, w, b, rank), dtype)


def _batch_norm_train(emit: Emit, n: Node) -> Any:
    x, w, b, rm, rv = n.inputs
    t = _t(x)
    dims = (0, *range(2, t.rank))
    count = 1
    for d in dims:
        if not isinstance(t.shape[d], int):
            return None
        count *= t.shape[d]
    if count <= 1:
        return None
    xf = _up(emit, x)
    y = _down(
        emit, _affine(emit, _normalize(emit, xf, dims, n.attrs["eps"]), w, b, t.rank), t.dtype
    )
    if rm is None:
        return (y,)
    m = n.attrs["momentum"]
    mean = emit("mean", xf, dims=dims)
    unbiased = emit("var", xf, dims=dims, correction=1)
    new_rm = emit("add", emit("mul", _up(emit, rm), 1 - m), emit("mul", mean, m))
    new_rv = emit("add", emit("mul", _up(emit, rv), 1 - m), emit("mul", unbiased, m))
    return (y, _down(emit, new_rm, _t(rm).dtype), _down(emit, new_rv, _t(rv).dtype))


def _group_norm(emit: Emit, n: Node) -> Any:
    x, w, b = n.inputs
    t = _t(x)
    if not t.is_static or 0 in t.shape:
        return None
    g = n.attrs["num_groups"]
    grouped = emit("reshape", _up(emit, x), shape=(t.shape[0], g, -1))
    y = emit("reshape", _normalize(emit, grouped, (2,), n.attrs["eps"]), shape=t.shape)
    return _down(emit, _affine(emit, y, w, b, t.rank), t.dtype)


DECOMPOSITIONS: dict[str, Callable[[Emit, Node], Any]] = {
    "gelu": _gelu,
    "silu": _silu,
    "softmax": _softmax,
    "log_softmax": _softmax,
    "layer_norm": _layer_norm,
    "batch_norm": _batch_norm,
    "batch_norm_train": _batch_norm_train,
    "group_norm": _group_norm,
}


@register_pass("decompose", CONTRACT, rules=tuple(f"decompose.{op}" for op in DECOMPOSITIONS))
def decompose(graph: Graph, ctx: PassContext) -> Graph:
    """Replace composite ops by primitives (option ``ops``: which ones; default all)."""
    wanted = set(ctx.option("ops", DECOMPOSITIONS))
    unknown = wanted - set(DECOMPOSITIONS)
    if unknown:
        raise InvalidOptionError(
            f"decompose: no decomposition for {sorted(unknown)}; "
            f"available: {sorted(DECOMPOSITIONS)}"
        )
    for node in list(graph.nodes):
        if node.op not in wanted:
            continue
        emit = Emitter(graph, graph.next_node_id())
        result = DECOMPOSITIONS[node.op](emit, node)
        if result is None:
            continue
        outs = result if isinstance(result, tuple) else (result,)
        for new, old in zip(outs, node.outputs):
            if str(new.type) != str(old.type):
                raise SemanticDriftError(
                    "decompose", f"decompose.{node.op} changed a type: {old.type} -> {new.type}"
                )
        at = graph.nodes.index(node)
        graph.nodes[at : at + 1] = emit.nodes
        replace_uses(graph, {id(o): n for o, n in zip(node.outputs, outs)})
        ctx.record.fired(f"decompose.{node.op}", [node.id], [n.id for n in emit.nodes])
    return graph

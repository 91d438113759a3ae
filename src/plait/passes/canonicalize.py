"""Canonicalize: one spelling per operation (exact: no arithmetic changes).

Views all become ``reshape`` or ``permute``; ``contiguous`` (a layout request, not a value
change) disappears; negative dims become positive, reduction dims sorted; pooling strides that
default to the kernel size are written out.
"""

from __future__ import annotations

from typing import Any

from plait.ir import TensorType, Value
from plait.passes.manager import EXACT, PassContext, register_pass
from plait.passes.rewrite import Match, Op, Rule, Var, apply_rules


def rank(v: Any) -> int:
    assert isinstance(v, Value) and isinstance(v.type, TensorType)
    return v.type.rank


def out_shape(m: Match) -> tuple[Any, ...]:
    t = m.root.outputs[0].type
    assert isinstance(t, TensorType)
    return t.shape


def _to_reshape(m: Match, emit: Any) -> Any:
    return emit("reshape", m["x"], shape=out_shape(m))


def _transpose(m: Match, emit: Any) -> Any:
    n = rank(m["x"])
    if n == 0:
        return m["x"]
    a, b = m.root.attrs["dim0"] % n, m.root.attrs["dim1"] % n
    dims = list(range(n))
    dims[a], dims[b] = dims[b], dims[a]
    return emit("permute", m["x"], dims=tuple(dims))


# op -> (attribute, the rank its dims index into: input rank + offset)
_SINGLE_DIM = {
    "softmax": ("dim", 0),
    "log_softmax": ("dim", 0),
    "select": ("dim", 0),
    "slice": ("dim", 0),
    "index_select": ("dim", 0),
    "split": ("dim", 0),
    "chunk": ("dim", 0),
    "cat": ("dim", 0),
    "stack": ("dim", 1),
}
_MULTI_DIM = {"sum", "mean", "amax", "amin", "var", "permute"}


def _normalized(node: Any) -> dict[str, Any] | None:
    x = node.inputs[0]
    n = rank(x)
    attrs = dict(node.attrs)
    if node.op in _SINGLE_DIM:
        key, extra = _SINGLE_DIM[node.op]
        bound = max(n + extra, 1)
        attrs[key] = attrs[key] % bound
    else:
        key = "dims"
        dims = attrs[key]
        if dims is None:
            return None
        fixed = tuple(d % max(n, 1) for d in dims)
        attrs[key] = fixed if node.op == "permute" else tuple(sorted(fixed))
        if node.op != "permute" and fixed and sorted(fixed) == list(range(n)):
            attrs[key] = None  # all dims: spelled None
    return attrs if attrs != node.attrs else None


def _normalize_dims(m: Match, emit: Any) -> Any:
    attrs = _normalized(m.root)
    if attrs is None:
        return None
    inputs = m.root.inputs
    if m.root.op in ("cat", "stack"):
        return emit(m.root.op, list(inputs), **attrs)
    return emit(m.root.op, *inputs, **attrs)


def _pool_stride(m: Match, emit: Any) -> Any:
    attrs = dict(m.root.attrs, stride=m.root.attrs["kernel_size"])
    return emit(m.root.op, m["x"], **attrs)


RULES = [
    Rule("canonicalize.view-to-reshape", Op("view", Var("x")), _to_reshape),
    Rule("canonicalize.flatten-to-reshape", Op("flatten", Var("x")), _to_reshape),
    Rule("canonicalize.squeeze-to-reshape", Op("squeeze", Var("x")), _to_reshape),
    Rule("canonicalize.unsqueeze-to-reshape", Op("unsqueeze", Var("x")), _to_reshape),
    Rule("canonicalize.transpose-to-permute", Op("transpose", Var("x")), _transpose),
    Rule("canonicalize.drop-contiguous", Op("contiguous", Var("x")), lambda m, e: m["x"]),
    Rule(
        "canonicalize.normalize-dims",
        Op((*_SINGLE_DIM, *_MULTI_DIM), any_args=True),
        _normalize_dims,
    ),
    Rule(
        "canonicalize.pool-stride-default",
        Op(("max_pool2d", "avg_pool2d"), Var("x"), attrs=lambda a: a["stride"] is None),
        _pool_stride,
    ),
]


@register_pass("canonicalize", EXACT, rules=tuple(r.name for r in RULES))
def canonicalize(graph: Any, ctx: PassContext) -> Any:
    """One spelling per operation."""
    return apply_rules(graph, RULES, ctx.record)

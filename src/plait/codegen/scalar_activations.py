"""Scalar rules of the activations (sigmoid, silu, gelu, relu and their relatives), with eager
PyTorch's semantics on special values: relu keeps NaN and -0.0, the ``*_relu6`` family
propagates NaN, attributes are rounded as ATen rounds them. :mod:`plait.codegen.scalar` holds
them among its rules.

Example:
    >>> sorted(ACTIVATIONS)[:4]
    ['elu', 'gelu', 'hardshrink', 'hardsigmoid']
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from plait.codegen.index import Ix
from plait.codegen.kir import KernelBuilder, Stmt
from plait.codegen.onednn_postops import eager_gelu_uses_onednn
from plait.codegen.scalar_args import Arg, Rule, out_type, rules_into, storage_type, to, unary_float
from plait.ir.graph import Node

ACTIVATIONS: dict[str, Rule] = {}
rule = rules_into(ACTIVATIONS)


def _sigmoid_of(b: KernelBuilder, x: Stmt, t: str) -> Stmt:
    one = b.const(1.0, t)
    return b.op("div", [one, b.op("add", [one, b.op("exp", [b.op("neg", [x], t)], t)], t)], t)


@rule("sigmoid")
def _sigmoid(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    return _sigmoid_of(b, x, t)


@rule("silu")
def _silu(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    one = b.const(1.0, t)
    denom = b.op("add", [one, b.op("exp", [b.op("neg", [x], t)], t)], t)
    return b.op("div", [x, denom], t)


@rule("gelu")
def _gelu(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    half, one = b.const(0.5, t), b.const(1.0, t)
    if node.attrs["approximate"] == "tanh":
        beta = b.const(math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5, t)
        kappa = b.const(0.044715, t)
        cube = b.op("mul", [b.op("mul", [x, x], t), x], t)
        inner = b.op("mul", [beta, b.op("add", [x, b.op("mul", [kappa, cube], t)], t)], t)
        return b.op(
            "mul", [b.op("mul", [half, x], t), b.op("add", [one, b.op("tanh", [inner], t)], t)], t
        )
    alpha = b.const(math.sqrt(0.5), t)
    erf = b.op("erf", [b.op("mul", [x, alpha], t)], t)
    y = b.op("mul", [b.op("mul", [x, half], t), b.op("add", [one, erf], t)], t)
    if eager_gelu_uses_onednn(node.inputs[0]):
        # NOTE: eager runs this gelu through oneDNN, whose gelu(+inf) is NaN (ATen's is +inf).
        inf = b.const(math.inf, t)
        return b.op("where", [b.op("eq", [x, inf], "b"), b.const(math.nan, t), y], t)
    return y


@rule("relu")
def _relu(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    # NOTE: PyTorch's relu is clamp_min(x, 0), ``0 > x ? 0 : x``: NaN and -0.0 pass through.
    t = out_type(node)
    x = to(b, args[0], t)
    zero = b.const(0, t)
    return b.op("where", [b.op("lt", [x, zero], "b"), zero, x], t)


def _attr_const(b: KernelBuilder, node: Node, name: str, t: str, storage: bool = False) -> Stmt:
    """A float attribute in the compute type; ``storage``: rounded to a 16-bit output dtype
    first (ATen converts it to the tensor's own scalar type)."""
    c = b.const(float(node.attrs[name]), t)
    return b.round(c, storage_type(node)) if storage else c


@rule("leaky_relu")
def _leaky_relu(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    slope = _attr_const(b, node, "negative_slope", t)
    positive = b.op("gt", [x, b.const(0.0, t)], "b")
    return b.op("where", [positive, x, b.op("mul", [x, slope], t)], t)


def _relu6_of(b: KernelBuilder, x: Stmt, t: str) -> Stmt:
    """min(max(x + 3, 0), 6), NaN propagating (ATen's vector loop; its scalar loop agrees)."""
    shifted = b.op("add", [x, b.const(3.0, t)], t)
    return b.op("min", [b.op("max", [shifted, b.const(0.0, t)], t), b.const(6.0, t)], t)


@rule("hardsigmoid", "hardswish")
def _hard(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    y = _relu6_of(b, x, t)
    if node.op == "hardswish":
        y = b.op("mul", [x, y], t)
    return b.op("div", [y, b.const(6.0, t)], t)


@rule("elu")
def _elu(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    # NOTE: ATen: negcoef = alpha * scale in the compute type; x < 0 (or NaN) takes the
    # expm1 branch as the vector loop does (NaN either way); +-0 is x * scale whatever alpha is.
    x, t = unary_float(b, node, args)
    alpha, scale = _attr_const(b, node, "alpha", t), _attr_const(b, node, "scale", t)
    negcoef = b.op("mul", [alpha, scale], t)
    neg = b.op(
        "mul",
        [b.op("expm1", [b.op("mul", [x, _attr_const(b, node, "input_scale", t)], t)], t), negcoef],
        t,
    )
    positive = b.op("ge", [x, b.const(0.0, t)], "b")
    return b.op("where", [positive, b.op("mul", [x, scale], t), neg], t)


@rule("softplus")
def _softplus(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    beta = _attr_const(b, node, "beta", t)
    scaled = b.op("mul", [x, beta], t)
    above = b.op("gt", [scaled, _attr_const(b, node, "threshold", t)], "b")
    soft = b.op("div", [b.op("log1p", [b.op("exp", [scaled], t)], t), beta], t)
    return b.op("where", [above, x, soft], t)


@rule("mish")
def _mish(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    softplus = b.op("log1p", [b.op("exp", [x], t)], t)
    return b.op("mul", [x, b.op("tanh", [softplus], t)], t)


@rule("logsigmoid")
def _logsigmoid(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    # NOTE: ATen's forward: min(x, 0) - log1p(exp(-|x|)) (logsigmoid(+inf) is +0).
    x, t = unary_float(b, node, args)
    tail = b.op("log1p", [b.op("exp", [b.op("neg", [b.op("abs", [x], t)], t)], t)], t)
    return b.op("sub", [b.op("min", [x, b.const(0.0, t)], t), tail], t)


@rule("hardshrink", "softshrink")
def _shrink(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    # NOTE: hardshrink compares with lambd in the tensor's dtype, softshrink in float (eager).
    lambd = _attr_const(b, node, "lambd", t, storage=node.op == "hardshrink")
    neg_lambd = b.op("neg", [lambd], t)
    if node.op == "hardshrink":
        inside = b.op("and", [b.op("ge", [x, neg_lambd], "b"), b.op("le", [x, lambd], "b")], "b")
        return b.op("where", [inside, b.const(0.0, t), x], t)
    # NOTE: x * 0 keeps the sign of x inside the band (ATen's scalar loop; its vector loop
    # writes +0 there, and eager's answer depends on an element's position).
    low = b.op(
        "where",
        [
            b.op("lt", [x, neg_lambd], "b"),
            b.op("add", [x, lambd], t),
            b.op("mul", [x, b.const(0.0, t)], t),
        ],
        t,
    )
    return b.op("where", [b.op("gt", [x, lambd], "b"), b.op("sub", [x, lambd], t), low], t)


@rule("threshold")
def _threshold(b: KernelBuilder, node: Node, args: Sequence[Arg], idx: tuple[Ix, ...]) -> Stmt:
    x, t = unary_float(b, node, args)
    bound = _attr_const(b, node, "threshold", t)
    value = _attr_const(b, node, "value", t)
    return b.op("where", [b.op("le", [x, bound], "b"), value, x], t)

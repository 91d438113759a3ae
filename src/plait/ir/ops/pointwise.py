"""Pointwise ops: unary math, binary arithmetic and comparisons, where, clamp, casts, masks."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from plait.ir.graph import Operand, Value
from plait.ir.ops.registry import (
    SCALAR_OR_TENSOR,
    TENSOR,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import broadcast_shapes, device_of, float_dtype, promote, require_float
from plait.ir.ops.vjp import VjpContext, nondifferentiable, vjp
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, ScalarType, TensorType, Type

FLOATS = FLOAT_DTYPES
NUMERIC = FLOAT_DTYPES + INT_DTYPES
ALL = (*NUMERIC, torch.bool)
SIGNED = tuple(d for d in NUMERIC if d != torch.uint8)


def _unary(
    name: str,
    fn: Callable[..., torch.Tensor],
    dtypes: tuple[torch.dtype, ...],
    *,
    to_float: bool = False,
    float_only: bool = False,
    attrs: tuple[Attr, ...] = (),
    doc: str = "",
) -> None:
    def rule(x: TensorType, **_: Any) -> list[Type]:
        if float_only:
            require_float(x, name)
        elif x.dtype not in dtypes:
            raise TypeRuleError(f"{name}: unsupported dtype {x.dtype}")
        return [x.with_dtype(float_dtype(x.dtype) if to_float else x.dtype)]

    register(OpDef(name, Category.POINTWISE, (Param("x"),), attrs, rule, fn, dtypes, doc))


_unary("relu", torch.relu, NUMERIC)
_unary(
    "gelu",
    lambda x, approximate: F.gelu(x, approximate=approximate),
    FLOATS,
    float_only=True,
    attrs=(Attr("approximate", "str", "none", ("none", "tanh")),),
)
_unary("silu", F.silu, FLOATS, float_only=True)
_unary("sigmoid", torch.sigmoid, NUMERIC, to_float=True)
_unary("tanh", torch.tanh, NUMERIC, to_float=True)
_unary("exp", torch.exp, NUMERIC, to_float=True)
_unary("log", torch.log, NUMERIC, to_float=True)
_unary("sqrt", torch.sqrt, NUMERIC, to_float=True)
_unary("rsqrt", torch.rsqrt, NUMERIC, to_float=True)
_unary("erf", torch.erf, NUMERIC, to_float=True)
_unary("reciprocal", torch.reciprocal, NUMERIC, to_float=True)
_unary("neg", torch.neg, SIGNED)
_unary("abs", torch.abs, NUMERIC)

# NOTE: float math on integers and bool computes in the default float dtype, as eager does.
FLOAT_MATH = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
              "atanh", "expm1", "log1p", "log2", "log10", "exp2", "erfc")  # fmt: skip
for _name in FLOAT_MATH:
    _unary(_name, getattr(torch, _name), ALL, to_float=True)
# Rounding keeps the dtype; on integers it is the identity (bool is refused, as eager does).
for _name in ("floor", "ceil", "trunc"):
    _unary(_name, getattr(torch, _name), NUMERIC)
_unary("frac", torch.frac, FLOATS, float_only=True)
_unary("sign", torch.sign, ALL, doc="(0 < x) - (x < 0): sign(NaN) is 0, sign(-0.0) is +0.0")
_unary("bitwise_not", torch.bitwise_not, (*INT_DTYPES, torch.bool))


def _round_rule(x: TensorType, decimals: int) -> list[Type]:
    if x.dtype not in NUMERIC:
        raise TypeRuleError(f"round: unsupported dtype {x.dtype}")
    if decimals != 0:
        require_float(x, "round(decimals=)")
    return [x]


register(
    OpDef(
        "round",
        Category.POINTWISE,
        (Param("x"),),
        (Attr("decimals", "int", 0),),
        _round_rule,
        lambda x, decimals: torch.round(x) if decimals == 0 else torch.round(x, decimals=decimals),
        NUMERIC,
        "round half to even, at ``decimals`` decimal digits",
    )
)


def _predicate_rule(x: TensorType) -> list[Type]:
    return [x.with_dtype(torch.bool)]


for _name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit"):
    register(
        OpDef(
            _name,
            Category.POINTWISE,
            (Param("x"),),
            (),
            _predicate_rule,
            getattr(torch, _name),
            ALL,
        )
    )


def _logical_not_rule(x: TensorType) -> list[Type]:
    return [x.with_dtype(torch.bool)]


register(
    OpDef(
        "logical_not",
        Category.POINTWISE,
        (Param("x"),),
        (),
        _logical_not_rule,
        torch.logical_not,
        ALL,
    )
)


def _cast_rule(x: TensorType, dtype: torch.dtype) -> list[Type]:
    return [x.with_dtype(dtype)]


register(
    OpDef(
        "to_dtype",
        Category.POINTWISE,
        (Param("x"),),
        (Attr("dtype", "dtype"),),
        _cast_rule,
        lambda x, dtype: x.to(dtype),
        ALL,
        "dtype conversion",
    )
)


# --- binary ------------------------------------------------------------------------------------
def _binary_shape(a: Type, b: Type) -> tuple[Any, ...]:
    shapes = [t.shape for t in (a, b) if isinstance(t, TensorType)]
    return broadcast_shapes(*shapes)


def _binary_rule(name: str, result: str, dtypes: tuple[torch.dtype, ...]) -> Callable[..., list]:
    def rule(a: Type, b: Type, **attrs: Any) -> list[Type]:
        dtype = promote(a, b)
        if dtype not in dtypes:
            raise TypeRuleError(f"{name}: unsupported dtype {dtype}")
        if name in ("add", "sub") and isinstance(a, ScalarType) and attrs.get("alpha") != 1:
            raise TypeRuleError(f"{name}: alpha must be 1 when the first operand is a scalar")
        if result == "bool":
            dtype = torch.bool
        elif result == "float" or (result == "true_div" and attrs.get("rounding_mode") is None):
            dtype = float_dtype(dtype)
        return [TensorType(_binary_shape(a, b), dtype, device_of(a, b))]

    return rule


def _scalar_first(fn: Callable[..., Any], swapped: Callable[..., Any]) -> Callable[..., Any]:
    """Eager PyTorch computes ``2.0 + x`` as ``x.__radd__(2.0)``; the reference does the same."""

    def ref(a: Any, b: Any, **attrs: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return fn(a, b, **attrs)
        return swapped(b, a, **attrs)

    return ref


_ALPHA = (Attr("alpha", "scalar", 1),)
_BINARIES: list[tuple[str, Callable[..., Any], str, tuple, tuple[Attr, ...], str]] = [
    (
        "add",
        _scalar_first(torch.add, lambda b, a, alpha: torch.add(b, a)),
        "promote",
        ALL,
        _ALPHA,
        SCALAR_OR_TENSOR,
    ),
    (
        "sub",
        _scalar_first(torch.sub, lambda b, a, alpha: torch.rsub(b, a)),
        "promote",
        NUMERIC,
        _ALPHA,
        SCALAR_OR_TENSOR,
    ),
    (
        "mul",
        _scalar_first(torch.mul, lambda b, a: torch.mul(b, a)),
        "promote",
        ALL,
        (),
        SCALAR_OR_TENSOR,
    ),
    (
        "div",
        lambda a, b, rounding_mode: torch.div(a, b, rounding_mode=rounding_mode),
        "true_div",
        NUMERIC,
        (Attr("rounding_mode", "str?", None, (None, "trunc", "floor")),),
        TENSOR,
    ),
    ("pow", torch.pow, "promote", NUMERIC, (), SCALAR_OR_TENSOR),
    ("maximum", torch.maximum, "promote", ALL, (), TENSOR),
    ("minimum", torch.minimum, "promote", ALL, (), TENSOR),
    ("eq", torch.eq, "bool", ALL, (), TENSOR),
    ("ne", torch.ne, "bool", ALL, (), TENSOR),
    ("lt", torch.lt, "bool", NUMERIC, (), TENSOR),
    ("le", torch.le, "bool", NUMERIC, (), TENSOR),
    ("gt", torch.gt, "bool", NUMERIC, (), TENSOR),
    ("ge", torch.ge, "bool", NUMERIC, (), TENSOR),
    ("logical_and", torch.logical_and, "bool", ALL, (), TENSOR),
    ("logical_or", torch.logical_or, "bool", ALL, (), TENSOR),
    ("logical_xor", torch.logical_xor, "bool", ALL, (), TENSOR),
    ("atan2", torch.atan2, "float", ALL, (), TENSOR),
    ("hypot", torch.hypot, "promote", FLOATS, (), TENSOR),
    ("copysign", torch.copysign, "float", ALL, (), TENSOR),
    ("fmod", torch.fmod, "promote", NUMERIC, (), TENSOR),
    ("remainder", torch.remainder, "promote", NUMERIC, (), SCALAR_OR_TENSOR),
    ("fmax", torch.fmax, "promote", NUMERIC, (), TENSOR),
    ("fmin", torch.fmin, "promote", NUMERIC, (), TENSOR),
    ("xlogy", torch.xlogy, "float", ALL, (), SCALAR_OR_TENSOR),
    ("bitwise_and", torch.bitwise_and, "promote", (*INT_DTYPES, torch.bool), (), TENSOR),
    ("bitwise_or", torch.bitwise_or, "promote", (*INT_DTYPES, torch.bool), (), TENSOR),
    ("bitwise_xor", torch.bitwise_xor, "promote", (*INT_DTYPES, torch.bool), (), TENSOR),
]
# NOTE: ops whose second operand must be a tensor (PyTorch has no Scalar overload for them).
_TENSOR_SECOND = ("maximum", "minimum", "logical_xor", "atan2", "hypot", "fmax", "fmin")

for _name, _fn, _result, _dtypes, _attrs, _first in _BINARIES:
    _second = TENSOR if _name in _TENSOR_SECOND else SCALAR_OR_TENSOR
    register(
        OpDef(
            _name,
            Category.POINTWISE,
            (Param("a", _first), Param("b", _second)),
            _attrs,
            _binary_rule(_name, _result, _dtypes),
            _fn,
            _dtypes,
        )
    )


def _where_rule(cond: TensorType, a: Type, b: Type) -> list[Type]:
    if cond.dtype != torch.bool:
        raise TypeRuleError(f"where: condition must be bool, got {cond.dtype}")
    shapes = [t.shape for t in (cond, a, b) if isinstance(t, TensorType)]
    return [TensorType(broadcast_shapes(*shapes), promote(a, b), device_of(cond, a, b))]


register(
    OpDef(
        "where",
        Category.POINTWISE,
        (Param("cond"), Param("a", SCALAR_OR_TENSOR), Param("b", SCALAR_OR_TENSOR)),
        (),
        _where_rule,
        torch.where,
        ALL,
    )
)


def _clamp_rule(x: TensorType, min: Any, max: Any) -> list[Type]:
    if min is None and max is None:
        raise TypeRuleError("clamp: at least one of min and max must be given")
    dtype = x.dtype
    for bound in (min, max):
        if bound is not None:
            dtype = torch.result_type(torch.empty([1], dtype=dtype, device="meta"), bound)
    if dtype not in NUMERIC:
        raise TypeRuleError(f"clamp: unsupported dtype {dtype}")
    return [x.with_dtype(dtype)]


register(
    OpDef(
        "clamp",
        Category.POINTWISE,
        (Param("x"),),
        (Attr("min", "scalar?", None), Attr("max", "scalar?", None)),
        _clamp_rule,
        lambda x, min, max: torch.clamp(x, min=min, max=max),
        NUMERIC,
    )
)


def _tri_rule(name: str) -> Callable[..., list[Type]]:
    def rule(x: TensorType, diagonal: int) -> list[Type]:
        if x.rank < 2:
            raise TypeRuleError(f"{name}: expects rank >= 2, got rank {x.rank}")
        return [x]

    return rule


register(
    OpDef(
        "triu",
        Category.POINTWISE,
        (Param("x"),),
        (Attr("diagonal", "int", 0),),
        _tri_rule("triu"),
        lambda x, diagonal: torch.triu(x, diagonal),
        ALL,
        "zero below the diagonal (index-dependent pointwise)",
    )
)
register(
    OpDef(
        "tril",
        Category.POINTWISE,
        (Param("x"),),
        (Attr("diagonal", "int", 0),),
        _tri_rule("tril"),
        lambda x, diagonal: torch.tril(x, diagonal),
        ALL,
        "zero above the diagonal (index-dependent pointwise)",
    )
)


# --- activations (torch.nn.functional), with ATen's CPU formulas -----------------------------
def _activation(name: str, fn: Callable[..., torch.Tensor], *attrs: Attr, doc: str = "") -> None:
    _unary(name, fn, FLOATS, float_only=True, attrs=attrs, doc=doc)


_activation(
    "leaky_relu",
    lambda x, negative_slope: F.leaky_relu(x, negative_slope),
    Attr("negative_slope", "float", 0.01),
    doc="x > 0 ? x : x * negative_slope",
)
_activation("hardsigmoid", F.hardsigmoid, doc="min(max(x + 3, 0), 6) / 6, NaN propagating")
_activation("hardswish", F.hardswish, doc="x * min(max(x + 3, 0), 6) / 6, NaN propagating")
_activation(
    "elu",
    lambda x, alpha, scale, input_scale: torch.ops.aten.elu(x, alpha, scale, input_scale),
    Attr("alpha", "float", 1.0),
    Attr("scale", "float", 1.0),
    Attr("input_scale", "float", 1.0),
    doc="x > 0 ? x * scale : expm1(x * input_scale) * (alpha * scale) (selu and celu too)",
)
_activation(
    "softplus",
    lambda x, beta, threshold: F.softplus(x, beta, threshold),
    Attr("beta", "float", 1.0),
    Attr("threshold", "float", 20.0),
    doc="x * beta > threshold ? x : log1p(exp(x * beta)) / beta",
)
_activation("mish", F.mish, doc="x * tanh(log1p(exp(x)))")
_activation("logsigmoid", F.logsigmoid, doc="min(x, 0) - log1p(exp(-|x|))")
_activation(
    "hardshrink",
    lambda x, lambd: F.hardshrink(x, lambd),
    Attr("lambd", "float", 0.5),
    doc="-lambd <= x <= lambd ? 0 : x",
)
_activation(
    "softshrink",
    lambda x, lambd: F.softshrink(x, lambd),
    Attr("lambd", "float", 0.5),
    doc="x > lambd ? x - lambd : (x < -lambd ? x + lambd : x * 0)",
)
_activation(
    "threshold",
    lambda x, threshold, value: F.threshold(x, threshold, value),
    Attr("threshold", "float"),
    Attr("value", "float"),
    doc="x <= threshold ? value : x",
)


def _nan_to_num_rule(x: TensorType, **_: Any) -> list[Type]:
    if x.dtype not in ALL:
        raise TypeRuleError(f"nan_to_num: unsupported dtype {x.dtype}")
    return [x]


register(
    OpDef(
        "nan_to_num",
        Category.POINTWISE,
        (Param("x"),),
        (Attr("nan", "float", 0.0), Attr("posinf", "float?", None), Attr("neginf", "float?", None)),
        _nan_to_num_rule,
        lambda x, nan, posinf, neginf: torch.nan_to_num(x, nan, posinf, neginf),
        ALL,
        "NaN, +inf, -inf replaced (by default with 0 and the dtype's largest finite values)",
    )
)


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: a rule computes in the cotangent's dtype and returns each gradient in its operand's type
# (ctx.sum_to reduces what broadcasting added and casts). The rules follow eager's formulas
# (PyTorch's derivatives.yaml and its backward kernels) term for term, including how each masks:
# a NaN cotangent times a zero mask stays NaN where eager multiplies, and is 0 where it selects.
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _unary_grad(ctx: VjpContext, grad: Callable[[Value, Value], Value]) -> list[Operand | None]:
    """``[grad(x, g)]`` for a one-operand op, where its operand wants a gradient."""
    (x,) = ctx.inputs
    if not ctx.wants(0):
        return [None]
    assert isinstance(x, Value)
    return [ctx.sum_to(grad(x, ctx.grad()), x.type)]


def _scaled(ctx: VjpContext, factor: Callable[[Value, Value], Value]) -> list[Operand | None]:
    """``[g * factor(x, y)]`` with ``y`` the forward result."""
    y = ctx.outputs[0]
    return _unary_grad(ctx, lambda x, g: ctx.call("mul", g, factor(x, y)))


def _zero_grads(ctx: VjpContext) -> list[Operand | None]:
    """Zeros for every wanted operand: eager's gradient of a piecewise-constant op."""
    return [
        ctx.zeros_like(o) if ctx.wants(i) and isinstance(o, Value) else None
        for i, o in enumerate(ctx.inputs)
    ]


def _binary_grads(
    ctx: VjpContext,
    grad_a: Callable[[Value], Value] | None,
    grad_b: Callable[[Value], Value] | None,
) -> list[Operand | None]:
    """``grad_a(g)`` and ``grad_b(g)`` (at the result's shape) summed to each wanted operand."""
    g = ctx.grad()
    out: list[Operand | None] = []
    for i, fn in enumerate((grad_a, grad_b)):
        o = ctx.inputs[i]
        if fn is None or not ctx.wants(i):
            out.append(None)
        else:
            assert isinstance(o, Value)
            out.append(ctx.sum_to(fn(g), o.type))
    return out


def _as_tensor(ctx: VjpContext, s: Operand, like: Value) -> Value:
    """The scalar operand ``s`` as a 0-d tensor of ``like``'s dtype and device."""
    t = like.type
    assert isinstance(t, TensorType)
    if isinstance(s, Value):
        zero = ctx.call("zeros", shape=(), dtype=t.dtype, device=t.device)
        return ctx.call("add", zero, s)
    return ctx.call("full", shape=(), dtype=t.dtype, device=t.device, value=s)


def _tensor_operand(ctx: VjpContext, o: Operand, like: Value) -> Value:
    """``o`` itself where it is a tensor, else as a 0-d tensor of ``like``'s dtype."""
    if isinstance(o, Value) and isinstance(o.type, TensorType):
        return o
    return _as_tensor(ctx, o, like)


@vjp("add", "sub")
def _add_vjp(ctx: VjpContext) -> list[Operand | None]:
    alpha = ctx.attrs.get("alpha", 1)

    def grad_b(g: Value) -> Value:
        scaled = g if alpha == 1 else ctx.call("mul", g, alpha)
        return ctx.call("neg", scaled) if ctx.node.op == "sub" else scaled

    return _binary_grads(ctx, lambda g: g, grad_b)


@vjp("mul")
def _mul_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    return _binary_grads(ctx, lambda g: ctx.call("mul", g, b), lambda g: ctx.call("mul", g, a))


@vjp("exp")
def _exp_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: y)


@vjp("sin")
def _sin_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("cos", x))


@vjp("relu")
def _relu_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    # NOTE: eager's threshold_backward on the result: y <= 0 ? 0 : g (a NaN input gives a NaN
    # result, and NaN <= 0 is false: the cotangent passes, as in eager)
    return _unary_grad(ctx, lambda x, g: ctx.call("where", ctx.call("le", y, 0), 0.0, g))


nondifferentiable(
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit",
)  # fmt: skip


vjp("floor", "ceil", "round", "trunc", "sign")(_zero_grads)


@vjp("frac")
def _frac_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _unary_grad(ctx, lambda x, g: g)


@vjp("neg")
def _neg_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _unary_grad(ctx, lambda x, g: ctx.call("neg", g))


@vjp("abs")
def _abs_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: sign(0) = sign(NaN) = 0: abs has gradient 0 there, as eager (grad * self.sgn())
    return _scaled(ctx, lambda x, y: ctx.call("sign", x))


@vjp("sqrt")
def _sqrt_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return _unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("mul", y, 2.0)))


@vjp("rsqrt")
def _rsqrt_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return _unary_grad(
        ctx, lambda x, g: ctx.call("mul", ctx.call("mul", g, -0.5), ctx.call("pow", y, 3))
    )


@vjp("reciprocal")
def _reciprocal_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return _unary_grad(ctx, lambda x, g: ctx.call("mul", ctx.call("neg", g), ctx.call("mul", y, y)))


@vjp("log")
def _log_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _unary_grad(ctx, lambda x, g: ctx.call("div", g, x))


@vjp("log2", "log10")
def _log_base_vjp(ctx: VjpContext) -> list[Operand | None]:
    ln_base = _LN2 if ctx.node.op == "log2" else _LN10
    return _unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("mul", x, ln_base)))


@vjp("log1p")
def _log1p_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("add", x, 1.0)))


@vjp("exp2")
def _exp2_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return _unary_grad(ctx, lambda x, g: ctx.call("mul", ctx.call("mul", g, y), _LN2))


@vjp("expm1")
def _expm1_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("add", y, 1.0))


@vjp("sigmoid")
def _sigmoid_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    # NOTE: eager's sigmoid_backward: g * (1 - y) * y
    return _unary_grad(
        ctx, lambda x, g: ctx.call("mul", ctx.call("mul", g, ctx.call("sub", 1.0, y)), y)
    )


@vjp("tanh")
def _tanh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("sub", 1.0, ctx.call("mul", y, y)))


@vjp("tan")
def _tan_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("add", ctx.call("mul", y, y), 1.0))


@vjp("cos")
def _cos_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("neg", ctx.call("sin", x)))


@vjp("sinh")
def _sinh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("cosh", x))


@vjp("cosh")
def _cosh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("sinh", x))


def _square(ctx: VjpContext, x: Value) -> Value:
    return ctx.call("mul", x, x)


@vjp("asin", "acos")
def _asin_acos_vjp(ctx: VjpContext) -> list[Operand | None]:
    def factor(x: Value, y: Value) -> Value:
        d = ctx.call("rsqrt", ctx.call("sub", 1.0, _square(ctx, x)))
        return ctx.call("neg", d) if ctx.node.op == "acos" else d

    return _scaled(ctx, factor)


@vjp("atan")
def _atan_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("add", _square(ctx, x), 1.0)))


@vjp("asinh")
def _asinh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("rsqrt", ctx.call("add", _square(ctx, x), 1.0)))


@vjp("acosh")
def _acosh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _scaled(ctx, lambda x, y: ctx.call("rsqrt", ctx.call("sub", _square(ctx, x), 1.0)))


@vjp("atanh")
def _atanh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return _unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("sub", 1.0, _square(ctx, x))))


@vjp("erf", "erfc")
def _erf_vjp(ctx: VjpContext) -> list[Operand | None]:
    scale = _TWO_OVER_SQRT_PI if ctx.node.op == "erf" else -_TWO_OVER_SQRT_PI

    def factor(x: Value, y: Value) -> Value:
        gauss = ctx.call("exp", ctx.call("neg", _square(ctx, x)))
        return ctx.call("mul", gauss, scale)

    return _scaled(ctx, factor)


# --- activations' derivatives (eager's *_backward kernels) --------------------------------------
@vjp("silu")
def _silu_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: silu_backward: g * s * (1 + x * (1 - s)), s = sigmoid(x)
    def factor(x: Value, y: Value) -> Value:
        s = ctx.call("sigmoid", x)
        inner = ctx.call("add", ctx.call("mul", x, ctx.call("sub", 1.0, s)), 1.0)
        return ctx.call("mul", s, inner)

    return _scaled(ctx, factor)


@vjp("mish")
def _mish_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: mish_backward: g * (t + x * sigmoid(x) * (1 - t^2)), t = tanh(softplus(x))
    def factor(x: Value, y: Value) -> Value:
        t = ctx.call("tanh", ctx.call("softplus", x))
        slope = ctx.call("sub", 1.0, _square(ctx, t))
        rest = ctx.call("mul", ctx.call("mul", x, ctx.call("sigmoid", x)), slope)
        return ctx.call("add", t, rest)

    return _scaled(ctx, factor)


_GELU_SQRT1_2 = math.sqrt(0.5)
_GELU_PDF = 1.0 / math.sqrt(2.0 * math.pi)  # M_2_SQRTPI * M_SQRT1_2 * 0.5
_GELU_TANH_BETA = math.sqrt(2.0 / math.pi)  # M_SQRT2 * M_2_SQRTPI * 0.5
_GELU_TANH_KAPPA = 0.044715


@vjp("gelu")
def _gelu_vjp(ctx: VjpContext) -> list[Operand | None]:
    c = ctx.call

    def exact(x: Value, y: Value) -> Value:
        # NOTE: Phi(x) + x * phi(x)
        cdf = c("mul", c("add", c("erf", c("mul", x, _GELU_SQRT1_2)), 1.0), 0.5)
        pdf = c("mul", c("exp", c("mul", _square(ctx, x), -0.5)), _GELU_PDF)
        return c("add", cdf, c("mul", x, pdf))

    def tanh_form(x: Value, y: Value) -> Value:
        # NOTE: d/dx 0.5 x (1 + tanh(u)), u = beta (x + kappa x^3)
        x_sq = _square(ctx, x)
        u = c("mul", c("add", x, c("mul", c("mul", x_sq, x), _GELU_TANH_KAPPA)), _GELU_TANH_BETA)
        t = c("tanh", u)
        left = c("mul", c("add", t, 1.0), 0.5)
        du = c("mul", c("add", c("mul", x_sq, 3.0 * _GELU_TANH_KAPPA), 1.0), _GELU_TANH_BETA)
        right = c("mul", c("mul", c("mul", x, 0.5), c("sub", 1.0, _square(ctx, t))), du)
        return c("add", left, right)

    return _scaled(ctx, exact if ctx.attrs["approximate"] == "none" else tanh_form)


@vjp("leaky_relu")
def _leaky_relu_vjp(ctx: VjpContext) -> list[Operand | None]:
    slope = ctx.attrs["negative_slope"]
    # NOTE: x > 0 ? g : g * slope (NaN takes the slope)
    return _unary_grad(
        ctx, lambda x, g: ctx.call("where", ctx.call("gt", x, 0), g, ctx.call("mul", g, slope))
    )


@vjp("elu")
def _elu_vjp(ctx: VjpContext) -> list[Operand | None]:
    alpha, scale, input_scale = (ctx.attrs[k] for k in ("alpha", "scale", "input_scale"))

    # NOTE: elu_backward on the input: x <= 0 ? g * input_scale * alpha * scale *
    # exp(x * input_scale) : g * scale (NaN takes the positive branch)
    def grad(x: Value, g: Value) -> Value:
        neg = ctx.call(
            "mul",
            ctx.call("mul", g, input_scale * alpha * scale),
            ctx.call("exp", ctx.call("mul", x, input_scale)),
        )
        pos = g if scale == 1.0 else ctx.call("mul", g, scale)
        return ctx.call("where", ctx.call("le", x, 0), neg, pos)

    return _unary_grad(ctx, grad)


@vjp("softplus")
def _softplus_vjp(ctx: VjpContext) -> list[Operand | None]:
    beta, threshold = ctx.attrs["beta"], ctx.attrs["threshold"]

    # NOTE: x * beta > threshold ? g : g * z / (z + 1), z = exp(x * beta): sigmoid(x * beta)
    def grad(x: Value, g: Value) -> Value:
        bx = x if beta == 1.0 else ctx.call("mul", x, beta)
        smooth = ctx.call("mul", g, ctx.call("sigmoid", bx))
        return ctx.call("where", ctx.call("gt", bx, threshold), g, smooth)

    return _unary_grad(ctx, grad)


@vjp("logsigmoid")
def _logsigmoid_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: eager's log_sigmoid_backward, x < 0 ? 1 - z / (1 + z) : z / (1 + z) with
    # z = exp(-|x|), is sigmoid(-x) on both branches (NaN stays NaN)
    return _scaled(ctx, lambda x, y: ctx.call("sigmoid", ctx.call("neg", x)))


@vjp("hardsigmoid")
def _hardsigmoid_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: -3 < x < 3 ? g / 6 : 0 (NaN gets 0)
    def grad(x: Value, g: Value) -> Value:
        inside = ctx.call("lt", ctx.call("abs", x), 3.0)
        return ctx.call("where", inside, ctx.call("mul", g, 1.0 / 6.0), 0.0)

    return _unary_grad(ctx, grad)


@vjp("hardswish")
def _hardswish_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: x <= -3 ? 0 : (x < 3 ? g * (x / 3 + 0.5) : g) (NaN takes the last branch: g)
    def grad(x: Value, g: Value) -> Value:
        ramp = ctx.call("mul", g, ctx.call("add", ctx.call("div", x, 3.0), 0.5))
        upper = ctx.call("where", ctx.call("lt", x, 3.0), ramp, g)
        return ctx.call("where", ctx.call("le", x, -3.0), 0.0, upper)

    return _unary_grad(ctx, grad)


@vjp("hardshrink", "softshrink")
def _shrink_vjp(ctx: VjpContext) -> list[Operand | None]:
    lambd = ctx.attrs["lambd"]
    # NOTE: -lambd <= x <= lambd ? 0 : g (NaN keeps g)
    return _unary_grad(
        ctx,
        lambda x, g: ctx.call("where", ctx.call("le", ctx.call("abs", x), lambd), 0.0, g),
    )


@vjp("threshold")
def _threshold_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: x <= threshold ? 0 : g (NaN keeps g)
    t = ctx.attrs["threshold"]
    return _unary_grad(ctx, lambda x, g: ctx.call("where", ctx.call("le", x, t), 0.0, g))


@vjp("nan_to_num")
def _nan_to_num_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: eager multiplies by the mask (a NaN cotangent stays NaN where x is not finite)
    return _scaled(ctx, lambda x, y: ctx.call("isfinite", x))


@vjp("clamp")
def _clamp_vjp(ctx: VjpContext) -> list[Operand | None]:
    lo, hi = ctx.attrs["min"], ctx.attrs["max"]

    # NOTE: eager's clamp_backward: g where min <= x <= max (both bounds inclusive), else 0;
    # NaN gets 0
    def grad(x: Value, g: Value) -> Value:
        keep = None
        if lo is not None:
            keep = ctx.call("ge", x, lo)
        if hi is not None:
            below = ctx.call("le", x, hi)
            keep = below if keep is None else ctx.call("logical_and", keep, below)
        return ctx.call("where", keep, g, 0.0)

    return _unary_grad(ctx, grad)


@vjp("to_dtype")
def _to_dtype_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    y = ctx.outputs[0]
    if not (_is_float_tensor(x) and _is_float_tensor(y)):
        return [None]  # NOTE: a cast from or to an integer or bool carries no gradient
    # NOTE: the gradient cast back to the input's dtype (sum_to casts)
    return _unary_grad(ctx, lambda x, g: g)


def _is_float_tensor(o: Operand) -> bool:
    return isinstance(o, Value) and isinstance(o.type, TensorType) and o.type.dtype in FLOATS


@vjp("tril", "triu")
def _tri_vjp(ctx: VjpContext) -> list[Operand | None]:
    op, diagonal = ctx.node.op, ctx.attrs["diagonal"]
    return _unary_grad(ctx, lambda x, g: ctx.call(op, g, diagonal=diagonal))


# --- binary derivatives ------------------------------------------------------------------------
@vjp("div")
def _div_vjp(ctx: VjpContext) -> list[Operand | None]:
    if ctx.attrs["rounding_mode"] is not None:
        return _zero_grads(ctx)  # NOTE: a rounded quotient is piecewise constant, as in eager
    b = ctx.inputs[1]
    y = ctx.outputs[0]
    # NOTE: eager: g / b and -g * ((a / b) / b), where a / b is the result
    return _binary_grads(
        ctx,
        lambda g: ctx.call("div", g, b),
        lambda g: ctx.call("mul", ctx.call("neg", g), ctx.call("div", y, b)),
    )


@vjp("pow")
def _pow_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    # NOTE: a number (bool is an int) is a constant of the rule
    if isinstance(a, Value) and isinstance(b, (int, float)):
        e = b
        return _binary_grads(ctx, lambda g: _pow_base_grad_scalar(ctx, g, a, e), None)
    if isinstance(b, Value) and isinstance(a, (int, float)):
        s = a
        return _binary_grads(ctx, None, lambda g: _pow_exponent_grad_scalar(ctx, g, s, b, y))
    # NOTE: a symbolic or scalar-valued operand becomes a 0-d tensor: eager's tensor formulas
    base, expo = _tensor_operand(ctx, a, y), _tensor_operand(ctx, b, y)
    return _binary_grads(
        ctx,
        lambda g: _pow_base_grad(ctx, g, base, expo),
        lambda g: _pow_exponent_grad(ctx, g, base, expo, y),
    )


def _pow_base_grad_scalar(ctx: VjpContext, g: Value, x: Value, e: float) -> Value:
    """d(x^e)/dx for a number ``e``: eager's pow_backward, g * (e * x^(e - 1)), 0 where e = 0."""
    c = ctx.call
    if e == 0:
        return ctx.zeros_like(x)
    if e == 1:
        return g  # NOTE: x^0 is 1 for every x, NaN included
    slope = c("mul", x, 2.0) if e == 2 else c("mul", c("pow", x, e - 1), e)
    return c("mul", g, slope)


def _pow_exponent_grad_scalar(ctx: VjpContext, g: Value, s: float, x: Value, y: Value) -> Value:
    """d(s^x)/dx for a number ``s``: g * s^x * log(s); where s = 0, 0 for x >= 0 (eager)."""
    c = ctx.call
    if s == 0:
        return c("mul", g, c("where", c("ge", x, 0), 0.0, c("mul", y, -math.inf)))
    return c("mul", g, c("mul", y, math.log(s) if s > 0 else math.nan))


def _pow_base_grad(ctx: VjpContext, g: Value, a: Value, b: Value) -> Value:
    """Eager's pow_backward_self: where(b == 0, 0, g * (b * a^(b - 1)))."""
    c = ctx.call
    slope = c("mul", b, c("pow", a, c("sub", b, 1)))
    return c("where", c("eq", b, 0), 0.0, c("mul", g, slope))


def _pow_exponent_grad(ctx: VjpContext, g: Value, a: Value, b: Value, y: Value) -> Value:
    """Eager's pow_backward_exponent: g * where(a == 0 & b >= 0, 0, y * log(a)), the log taken
    in the result's dtype."""
    c = ctx.call
    dtype = _dtype(y)
    base = a if _dtype(a) == dtype else c("to_dtype", a, dtype=dtype)
    zero_base = c("logical_and", c("eq", a, 0), c("ge", b, 0))
    return c("mul", g, c("where", zero_base, 0.0, c("mul", y, c("log", base))))


def _dtype(v: Value) -> torch.dtype:
    assert isinstance(v.type, TensorType)
    return v.type.dtype


@vjp("maximum", "minimum")
def _max_min_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    c = ctx.call
    # NOTE: eager: ties split the cotangent in halves; the smaller (maximum) or larger
    # (minimum) operand gets 0; a NaN on either side gives both operands the cotangent
    lose_a, lose_b = ("lt", "gt") if ctx.node.op == "maximum" else ("gt", "lt")
    shared: list[Value] = []

    def split(g: Value) -> Value:
        if not shared:
            shared.append(c("where", c("eq", a, b), c("div", g, 2.0), g))
        return shared[0]

    return _binary_grads(
        ctx,
        lambda g: c("where", c(lose_a, a, b), 0.0, split(g)),
        lambda g: c("where", c(lose_b, a, b), 0.0, split(g)),
    )


@vjp("fmax", "fmin")
def _fmax_fmin_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    c = ctx.call
    # NOTE: eager: a takes the cotangent where a >= b (fmax) or a <= b (fmin), or where b is NaN;
    # b takes it everywhere else (ties go to a)
    to_a = c("logical_or", c("ge" if ctx.node.op == "fmax" else "le", a, b), c("isnan", b))
    return _binary_grads(
        ctx, lambda g: c("where", to_a, g, 0.0), lambda g: c("where", to_a, 0.0, g)
    )


@vjp("atan2")
def _atan2_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    c = ctx.call
    shared: list[Value] = []

    def recip() -> Value:
        if not shared:
            r = c("reciprocal", c("add", c("mul", a, a), c("mul", b, b)))
            shared.append(c("where", c("isinf", r), 0.0, r))
        return shared[0]

    # NOTE: eager's atan2_backward: g * b * r and g * -a * r, r = 1 / (a^2 + b^2) with 0 for
    # an infinite r (at the origin, and where a^2 + b^2 underflows)
    return _binary_grads(
        ctx,
        lambda g: c("mul", c("mul", g, b), recip()),
        lambda g: c("mul", c("mul", g, c("neg", a)), recip()),
    )


@vjp("hypot")
def _hypot_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    c = ctx.call
    return _binary_grads(
        ctx, lambda g: c("div", c("mul", g, a), y), lambda g: c("div", c("mul", g, b), y)
    )


@vjp("copysign")
def _copysign_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    c = ctx.call
    # NOTE: eager: g * (y / a), 0 where a == 0; the sign operand gets zeros
    ga, _ = _binary_grads(
        ctx, lambda g: c("mul", g, c("where", c("eq", a, 0), 0.0, c("div", y, a))), None
    )
    gb = ctx.zeros_like(b) if ctx.wants(1) and isinstance(b, Value) else None
    return [ga, gb]


@vjp("fmod", "remainder")
def _fmod_remainder_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    c = ctx.call
    mode = "trunc" if ctx.node.op == "fmod" else "floor"

    # NOTE: a - q * b with q = div(a, b, rounding_mode) piecewise constant: g and -g * q
    def grad_b(g: Value) -> Value:
        # NOTE: eager has no derivative of number % tensor; it gets the tensor % tensor one
        dividend = _tensor_operand(ctx, a, y)
        return c("mul", c("neg", g), c("div", dividend, b, rounding_mode=mode))

    return _binary_grads(ctx, lambda g: g, grad_b)


@vjp("xlogy")
def _xlogy_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    c = ctx.call

    # NOTE: eager: xlogy(g, b), 0 where a == 0 and b <= 0; and g * a / b
    def grad_a(g: Value) -> Value:
        d = c("xlogy", g, b)
        if isinstance(b, (int, float)):
            return d if not b <= 0 else c("where", c("eq", a, 0), 0.0, d)
        zero_a = c("logical_and", c("eq", a, 0), c("le", _tensor_operand(ctx, b, y), 0))
        return c("where", zero_a, 0.0, d)

    return _binary_grads(ctx, grad_a, lambda g: c("div", c("mul", g, a), b))


@vjp("where")
def _where_vjp(ctx: VjpContext) -> list[Operand | None]:
    cond = ctx.inputs[0]
    g = ctx.grad()
    out: list[Operand | None] = [None]  # NOTE: the condition is boolean: no gradient
    for i, (on_true, on_false) in ((1, (g, 0.0)), (2, (0.0, g))):
        o = ctx.inputs[i]
        if ctx.wants(i) and isinstance(o, Value):
            out.append(ctx.sum_to(ctx.call("where", cond, on_true, on_false), o.type))
        else:
            out.append(None)
    return out

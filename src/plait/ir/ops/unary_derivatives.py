"""Derivatives of the unary pointwise ops: math functions, activations (eager's ``*_backward``
kernels), casts and masks."""

from __future__ import annotations

import math

from plait.ir.graph import Operand, Value
from plait.ir.ops.pointwise_grads import (
    scaled_grad,
    unary_grad,
    zero_grads,
)
from plait.ir.ops.vjp import VjpContext, nondifferentiable, vjp
from plait.ir.types import FLOAT_DTYPES as FLOATS
from plait.ir.types import TensorType

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


@vjp("exp")
def _exp_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: y)


@vjp("sin")
def _sin_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("cos", x))


@vjp("relu")
def _relu_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    # NOTE: eager's threshold_backward on the result: y <= 0 ? 0 : g (a NaN input gives a NaN
    # result, and NaN <= 0 is false: the cotangent passes, as in eager)
    return unary_grad(ctx, lambda x, g: ctx.call("where", ctx.call("le", y, 0), 0.0, g))


nondifferentiable(
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit",
)  # fmt: skip


vjp("floor", "ceil", "round", "trunc", "sign")(zero_grads)


@vjp("frac")
def _frac_vjp(ctx: VjpContext) -> list[Operand | None]:
    return unary_grad(ctx, lambda x, g: g)


@vjp("neg")
def _neg_vjp(ctx: VjpContext) -> list[Operand | None]:
    return unary_grad(ctx, lambda x, g: ctx.call("neg", g))


@vjp("abs")
def _abs_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: sign(0) = sign(NaN) = 0: abs has gradient 0 there, as eager (grad * self.sgn())
    return scaled_grad(ctx, lambda x, y: ctx.call("sign", x))


@vjp("sqrt")
def _sqrt_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("mul", y, 2.0)))


@vjp("rsqrt")
def _rsqrt_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return unary_grad(
        ctx, lambda x, g: ctx.call("mul", ctx.call("mul", g, -0.5), ctx.call("pow", y, 3))
    )


@vjp("reciprocal")
def _reciprocal_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return unary_grad(ctx, lambda x, g: ctx.call("mul", ctx.call("neg", g), ctx.call("mul", y, y)))


@vjp("log")
def _log_vjp(ctx: VjpContext) -> list[Operand | None]:
    return unary_grad(ctx, lambda x, g: ctx.call("div", g, x))


@vjp("log2", "log10")
def _log_base_vjp(ctx: VjpContext) -> list[Operand | None]:
    ln_base = _LN2 if ctx.node.op == "log2" else _LN10
    return unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("mul", x, ln_base)))


@vjp("log1p")
def _log1p_vjp(ctx: VjpContext) -> list[Operand | None]:
    return unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("add", x, 1.0)))


@vjp("exp2")
def _exp2_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    return unary_grad(ctx, lambda x, g: ctx.call("mul", ctx.call("mul", g, y), _LN2))


@vjp("expm1")
def _expm1_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("add", y, 1.0))


@vjp("sigmoid")
def _sigmoid_vjp(ctx: VjpContext) -> list[Operand | None]:
    y = ctx.outputs[0]
    # NOTE: eager's sigmoid_backward: g * (1 - y) * y
    return unary_grad(
        ctx, lambda x, g: ctx.call("mul", ctx.call("mul", g, ctx.call("sub", 1.0, y)), y)
    )


@vjp("tanh")
def _tanh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("sub", 1.0, ctx.call("mul", y, y)))


@vjp("tan")
def _tan_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("add", ctx.call("mul", y, y), 1.0))


@vjp("cos")
def _cos_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("neg", ctx.call("sin", x)))


@vjp("sinh")
def _sinh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("cosh", x))


@vjp("cosh")
def _cosh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("sinh", x))


def _square(ctx: VjpContext, x: Value) -> Value:
    return ctx.call("mul", x, x)


@vjp("asin", "acos")
def _asin_acos_vjp(ctx: VjpContext) -> list[Operand | None]:
    def factor(x: Value, y: Value) -> Value:
        d = ctx.call("rsqrt", ctx.call("sub", 1.0, _square(ctx, x)))
        return ctx.call("neg", d) if ctx.node.op == "acos" else d

    return scaled_grad(ctx, factor)


@vjp("atan")
def _atan_vjp(ctx: VjpContext) -> list[Operand | None]:
    return unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("add", _square(ctx, x), 1.0)))


@vjp("asinh")
def _asinh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("rsqrt", ctx.call("add", _square(ctx, x), 1.0)))


@vjp("acosh")
def _acosh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return scaled_grad(ctx, lambda x, y: ctx.call("rsqrt", ctx.call("sub", _square(ctx, x), 1.0)))


@vjp("atanh")
def _atanh_vjp(ctx: VjpContext) -> list[Operand | None]:
    return unary_grad(ctx, lambda x, g: ctx.call("div", g, ctx.call("sub", 1.0, _square(ctx, x))))


@vjp("erf", "erfc")
def _erf_vjp(ctx: VjpContext) -> list[Operand | None]:
    scale = _TWO_OVER_SQRT_PI if ctx.node.op == "erf" else -_TWO_OVER_SQRT_PI

    def factor(x: Value, y: Value) -> Value:
        gauss = ctx.call("exp", ctx.call("neg", _square(ctx, x)))
        return ctx.call("mul", gauss, scale)

    return scaled_grad(ctx, factor)


# --- activations' derivatives (eager's *_backward kernels) --------------------------------------
@vjp("silu")
def _silu_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: silu_backward: g * s * (1 + x * (1 - s)), s = sigmoid(x)
    def factor(x: Value, y: Value) -> Value:
        s = ctx.call("sigmoid", x)
        inner = ctx.call("add", ctx.call("mul", x, ctx.call("sub", 1.0, s)), 1.0)
        return ctx.call("mul", s, inner)

    return scaled_grad(ctx, factor)


@vjp("mish")
def _mish_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: mish_backward: g * (t + x * sigmoid(x) * (1 - t^2)), t = tanh(softplus(x))
    def factor(x: Value, y: Value) -> Value:
        t = ctx.call("tanh", ctx.call("softplus", x))
        slope = ctx.call("sub", 1.0, _square(ctx, t))
        rest = ctx.call("mul", ctx.call("mul", x, ctx.call("sigmoid", x)), slope)
        return ctx.call("add", t, rest)

    return scaled_grad(ctx, factor)


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

    return scaled_grad(ctx, exact if ctx.attrs["approximate"] == "none" else tanh_form)


@vjp("leaky_relu")
def _leaky_relu_vjp(ctx: VjpContext) -> list[Operand | None]:
    slope = ctx.attrs["negative_slope"]
    # NOTE: x > 0 ? g : g * slope (NaN takes the slope)
    return unary_grad(
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

    return unary_grad(ctx, grad)


@vjp("softplus")
def _softplus_vjp(ctx: VjpContext) -> list[Operand | None]:
    beta, threshold = ctx.attrs["beta"], ctx.attrs["threshold"]

    # NOTE: x * beta > threshold ? g : g * z / (z + 1), z = exp(x * beta): sigmoid(x * beta)
    def grad(x: Value, g: Value) -> Value:
        bx = x if beta == 1.0 else ctx.call("mul", x, beta)
        smooth = ctx.call("mul", g, ctx.call("sigmoid", bx))
        return ctx.call("where", ctx.call("gt", bx, threshold), g, smooth)

    return unary_grad(ctx, grad)


@vjp("logsigmoid")
def _logsigmoid_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: eager's log_sigmoid_backward, x < 0 ? 1 - z / (1 + z) : z / (1 + z) with
    # z = exp(-|x|), is sigmoid(-x) on both branches (NaN stays NaN)
    return scaled_grad(ctx, lambda x, y: ctx.call("sigmoid", ctx.call("neg", x)))


@vjp("hardsigmoid")
def _hardsigmoid_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: -3 < x < 3 ? g / 6 : 0 (NaN gets 0)
    def grad(x: Value, g: Value) -> Value:
        inside = ctx.call("lt", ctx.call("abs", x), 3.0)
        return ctx.call("where", inside, ctx.call("mul", g, 1.0 / 6.0), 0.0)

    return unary_grad(ctx, grad)


@vjp("hardswish")
def _hardswish_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: x <= -3 ? 0 : (x < 3 ? g * (x / 3 + 0.5) : g) (NaN takes the last branch: g)
    def grad(x: Value, g: Value) -> Value:
        ramp = ctx.call("mul", g, ctx.call("add", ctx.call("div", x, 3.0), 0.5))
        upper = ctx.call("where", ctx.call("lt", x, 3.0), ramp, g)
        return ctx.call("where", ctx.call("le", x, -3.0), 0.0, upper)

    return unary_grad(ctx, grad)


@vjp("hardshrink", "softshrink")
def _shrink_vjp(ctx: VjpContext) -> list[Operand | None]:
    lambd = ctx.attrs["lambd"]
    # NOTE: -lambd <= x <= lambd ? 0 : g (NaN keeps g)
    return unary_grad(
        ctx,
        lambda x, g: ctx.call("where", ctx.call("le", ctx.call("abs", x), lambd), 0.0, g),
    )


@vjp("threshold")
def _threshold_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: x <= threshold ? 0 : g (NaN keeps g)
    t = ctx.attrs["threshold"]
    return unary_grad(ctx, lambda x, g: ctx.call("where", ctx.call("le", x, t), 0.0, g))


@vjp("nan_to_num")
def _nan_to_num_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: eager multiplies by the mask (a NaN cotangent stays NaN where x is not finite)
    return scaled_grad(ctx, lambda x, y: ctx.call("isfinite", x))


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

    return unary_grad(ctx, grad)


@vjp("to_dtype")
def _to_dtype_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    y = ctx.outputs[0]
    if not (_is_float_tensor(x) and _is_float_tensor(y)):
        return [None]  # NOTE: a cast from or to an integer or bool carries no gradient
    # NOTE: the gradient cast back to the input's dtype (sum_to casts)
    return unary_grad(ctx, lambda x, g: g)


def _is_float_tensor(o: Operand) -> bool:
    return isinstance(o, Value) and isinstance(o.type, TensorType) and o.type.dtype in FLOATS


@vjp("tril", "triu")
def _tri_vjp(ctx: VjpContext) -> list[Operand | None]:
    op, diagonal = ctx.node.op, ctx.attrs["diagonal"]
    return unary_grad(ctx, lambda x, g: ctx.call(op, g, diagonal=diagonal))

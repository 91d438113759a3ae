"""Derivatives of the binary pointwise ops (add, mul, div, pow, maximum/minimum, atan2, ...)
and of where."""

from __future__ import annotations

import math

import torch

from plait.ir.graph import Operand, Value
from plait.ir.ops.pointwise_grads import (
    binary_grads,
    tensor_operand,
    zero_grads,
)
from plait.ir.ops.vjp import VjpContext, vjp
from plait.ir.types import TensorType


@vjp("add", "sub")
def _add_vjp(ctx: VjpContext) -> list[Operand | None]:
    alpha = ctx.attrs.get("alpha", 1)

    def grad_b(g: Value) -> Value:
        scaled = g if alpha == 1 else ctx.call("mul", g, alpha)
        return ctx.call("neg", scaled) if ctx.node.op == "sub" else scaled

    return binary_grads(ctx, lambda g: g, grad_b)


@vjp("mul")
def _mul_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    return binary_grads(ctx, lambda g: ctx.call("mul", g, b), lambda g: ctx.call("mul", g, a))


@vjp("div")
def _div_vjp(ctx: VjpContext) -> list[Operand | None]:
    if ctx.attrs["rounding_mode"] is not None:
        return zero_grads(ctx)  # NOTE: a rounded quotient is piecewise constant, as in eager
    b = ctx.inputs[1]
    y = ctx.outputs[0]
    # NOTE: eager: g / b and -g * ((a / b) / b), where a / b is the result
    return binary_grads(
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
        return binary_grads(ctx, lambda g: _pow_base_grad_scalar(ctx, g, a, e), None)
    if isinstance(b, Value) and isinstance(a, (int, float)):
        s = a
        return binary_grads(ctx, None, lambda g: _pow_exponent_grad_scalar(ctx, g, s, b, y))
    # NOTE: a symbolic or scalar-valued operand becomes a 0-d tensor: eager's tensor formulas
    base, expo = tensor_operand(ctx, a, y), tensor_operand(ctx, b, y)
    return binary_grads(
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

    return binary_grads(
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
    return binary_grads(ctx, lambda g: c("where", to_a, g, 0.0), lambda g: c("where", to_a, 0.0, g))


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
    return binary_grads(
        ctx,
        lambda g: c("mul", c("mul", g, b), recip()),
        lambda g: c("mul", c("mul", g, c("neg", a)), recip()),
    )


@vjp("hypot")
def _hypot_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    c = ctx.call
    return binary_grads(
        ctx, lambda g: c("div", c("mul", g, a), y), lambda g: c("div", c("mul", g, b), y)
    )


@vjp("copysign")
def _copysign_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.inputs
    y = ctx.outputs[0]
    c = ctx.call
    # NOTE: eager: g * (y / a), 0 where a == 0; the sign operand gets zeros
    ga, _ = binary_grads(
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
        dividend = tensor_operand(ctx, a, y)
        return c("mul", c("neg", g), c("div", dividend, b, rounding_mode=mode))

    return binary_grads(ctx, lambda g: g, grad_b)


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
        zero_a = c("logical_and", c("eq", a, 0), c("le", tensor_operand(ctx, b, y), 0))
        return c("where", zero_a, 0.0, d)

    return binary_grads(ctx, grad_a, lambda g: c("div", c("mul", g, a), b))


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

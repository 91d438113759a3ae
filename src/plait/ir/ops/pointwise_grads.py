"""Building blocks of the pointwise derivative rules.

A rule computes in the cotangent's dtype and returns each gradient in its operand's type
(``ctx.sum_to`` reduces what broadcasting added and casts). The rules follow eager's formulas
(PyTorch's derivatives.yaml and its backward kernels) term for term, including how each masks:
a NaN cotangent times a zero mask stays NaN where eager multiplies, and is 0 where it selects."""

from __future__ import annotations

from collections.abc import Callable

from plait.ir.graph import Operand, Value
from plait.ir.ops.vjp import VjpContext
from plait.ir.types import TensorType


def unary_grad(ctx: VjpContext, grad: Callable[[Value, Value], Value]) -> list[Operand | None]:
    """``[grad(x, g)]`` for a one-operand op, where its operand wants a gradient."""
    (x,) = ctx.inputs
    if not ctx.wants(0):
        return [None]
    assert isinstance(x, Value)
    return [ctx.sum_to(grad(x, ctx.grad()), x.type)]


def scaled_grad(ctx: VjpContext, factor: Callable[[Value, Value], Value]) -> list[Operand | None]:
    """``[g * factor(x, y)]`` with ``y`` the forward result."""
    y = ctx.outputs[0]
    return unary_grad(ctx, lambda x, g: ctx.call("mul", g, factor(x, y)))


def zero_grads(ctx: VjpContext) -> list[Operand | None]:
    """Zeros for every wanted operand: eager's gradient of a piecewise-constant op."""
    return [
        ctx.zeros_like(o) if ctx.wants(i) and isinstance(o, Value) else None
        for i, o in enumerate(ctx.inputs)
    ]


def binary_grads(
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


def as_tensor(ctx: VjpContext, s: Operand, like: Value) -> Value:
    """The scalar operand ``s`` as a 0-d tensor of ``like``'s dtype and device."""
    t = like.type
    assert isinstance(t, TensorType)
    if isinstance(s, Value):
        zero = ctx.call("zeros", shape=(), dtype=t.dtype, device=t.device)
        return ctx.call("add", zero, s)
    return ctx.call("full", shape=(), dtype=t.dtype, device=t.device, value=s)


def tensor_operand(ctx: VjpContext, o: Operand, like: Value) -> Value:
    """``o`` itself where it is a tensor, else as a 0-d tensor of ``like``'s dtype."""
    if isinstance(o, Value) and isinstance(o.type, TensorType):
        return o
    return as_tensor(ctx, o, like)

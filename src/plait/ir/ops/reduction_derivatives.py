"""Derivatives of the reductions, the softmax family and the normalizations."""

from __future__ import annotations

import math

import sympy
import torch

from plait.ir.graph import Operand, Value
from plait.ir.ops.registry import (
    TypeRuleError,
)
from plait.ir.ops.rules import reduce_shape, wrap_dims
from plait.ir.ops.vjp import VjpContext, empty_batch_zeros, is_empty, nondifferentiable, vjp
from plait.ir.types import TensorType
from plait.symbolic import Dim, dims_equal, normalize, product

# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: a rule computes in the cotangent's dtype and returns each gradient in its operand's type.
# The composite ops (softmax family, normalizations) compute 16-bit floats in float32, as eager's
# backward kernels do (opmath).


def _tt(o: Operand) -> TensorType:
    assert isinstance(o, Value) and isinstance(o.type, TensorType)
    return o.type


def _cast(ctx: VjpContext, v: Value, dtype: torch.dtype) -> Value:
    return v if _tt(v).dtype == dtype else ctx.call("to_dtype", v, dtype=dtype)


def _opmath(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _count(shape: tuple[Dim, ...], axes: tuple[int, ...]) -> Dim:
    return product(shape[a] for a in axes)


def _restore_dims(
    ctx: VjpContext, v: Value, x: TensorType, axes: tuple[int, ...], keepdim: bool
) -> Value:
    """``v``, a reduction of ``x`` over ``axes``, with the reduced dims back as size 1."""
    if keepdim or not axes:
        return v
    return ctx.call("reshape", v, shape=reduce_shape(x.shape, axes, True))


def _expand_to(ctx: VjpContext, v: Value, x: TensorType) -> Value:
    t = _tt(v)
    if len(t.shape) == x.rank and all(dims_equal(a, b) for a, b in zip(t.shape, x.shape)):
        return v
    return ctx.call("expand", v, shape=x.shape)


def _reduced_grad(ctx: VjpContext, name: str) -> tuple[Value, TensorType, tuple[int, ...]]:
    """The cotangent of a ``dims``/``keepdim`` reduction with its reduced dims restored (size 1),
    the input's type and the normalized reduced axes."""
    x = _tt(ctx.inputs[0])
    axes = wrap_dims(ctx.attrs["dims"], x.rank, name)
    return _restore_dims(ctx, ctx.grad(), x, axes, ctx.attrs["keepdim"]), x, axes


@vjp("sum")
def _sum_vjp(ctx: VjpContext) -> list[Operand | None]:
    g, x, _ = _reduced_grad(ctx, "sum")
    return [_expand_to(ctx, _cast(ctx, g, x.dtype), x)]


@vjp("nansum")
def _nansum_vjp(ctx: VjpContext) -> list[Operand | None]:
    g, x, _ = _reduced_grad(ctx, "nansum")
    g = _expand_to(ctx, _cast(ctx, g, x.dtype), x)
    # NOTE: eager multiplies by the not-NaN mask (a NaN cotangent stays NaN at NaN elements)
    keep = ctx.call("logical_not", ctx.call("isnan", ctx.inputs[0]))
    return [ctx.call("mul", g, keep)]


@vjp("mean")
def _mean_vjp(ctx: VjpContext) -> list[Operand | None]:
    g, x, axes = _reduced_grad(ctx, "mean")
    n = _count(x.shape, axes)
    if not (isinstance(n, int) and n == 1):
        g = ctx.call("div", g, n)
    return [_expand_to(ctx, _cast(ctx, g, x.dtype), x)]


@vjp("amax", "amin")
def _amax_amin_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Eager's rule: the cotangent split evenly among the elements equal to the result."""
    g, x, axes = _reduced_grad(ctx, ctx.node.op)
    result = _restore_dims(ctx, ctx.outputs[0], x, axes, ctx.attrs["keepdim"])
    hit = ctx.call("eq", ctx.inputs[0], result)
    count = ctx.call("sum", hit, dims=axes, keepdim=True)
    return [ctx.call("mul", ctx.call("div", g, count), hit)]


@vjp("var")
def _var_vjp(ctx: VjpContext) -> list[Operand | None]:
    g, x, axes = _reduced_grad(ctx, "var")
    xv = ctx.inputs[0]
    correction = ctx.attrs["correction"]
    n = _count(x.shape, axes)
    centered = ctx.call("sub", xv, ctx.call("mean", xv, dims=axes, keepdim=True))
    if isinstance(n, int) and not isinstance(correction, sympy.Expr):
        dof = n - correction
        # NOTE: as eager: 2 / (n - correction) in double, +inf when no degree of freedom is left
        scale = ctx.call("mul", g, 2.0 / dof if dof != 0 else math.inf)
    elif isinstance(correction, int) or (isinstance(correction, float) and correction.is_integer()):
        scale = ctx.call("div", ctx.call("mul", g, 2.0), normalize(n - int(correction)))
    else:
        count = ctx.call("full", shape=(), dtype=_tt(g).dtype, device=x.device, value=n)
        scale = ctx.call("div", ctx.call("mul", g, 2.0), ctx.call("sub", count, correction))
    return [ctx.call("mul", scale, centered)]


@vjp("prod")
def _prod_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Each element's gradient is the product of the others in its slice. Where the slice has no
    zero that is ``result / x`` (eager's formula); where it has one zero, the zero's gradient is
    the product of the nonzero elements and the others' is 0; with two zeros every gradient is 0.

    NOTE: eager takes its zero-safe path (exclusive products) for every slice once the tensor has
    a zero anywhere; this rule decides per slice. The two differ only there: at an infinite or
    NaN element (eager: the product of the others; here NaN, as eager's ``result / x`` gives it
    in a tensor without zeros) and in the last bits of slices without a zero.
    """
    xv = ctx.inputs[0]
    assert isinstance(xv, Value)
    x = _tt(xv)
    dims, keepdim = ctx.attrs["dims"], ctx.attrs["keepdim"]
    g = ctx.grad()
    if x.rank == 0:
        return [_cast(ctx, g, x.dtype)]
    axes = wrap_dims(dims, x.rank, "prod")
    dt = _tt(g).dtype
    xg = _cast(ctx, xv, dt)
    g = _restore_dims(ctx, g, x, axes, keepdim)
    zero = ctx.call("eq", xg, 0)
    zeros = ctx.call("sum", zero, dims=axes, keepdim=True)
    nonzero = ctx.call("where", zero, 1.0, xg)
    rest = ctx.call("prod", nonzero, dims=dims, keepdim=True)
    # NOTE: the product of the other elements when at most that element is zero
    others = ctx.call("where", zero, rest, ctx.call("div", rest, xg))
    alone = ctx.call("eq", zeros, ctx.call("to_dtype", zero, dtype=torch.int64))
    # NOTE: times the mask, not where: 0 * a NaN or inf product is NaN, as in eager's products
    factor = ctx.call("mul", others, alone)
    return [_cast(ctx, ctx.call("mul", g, factor), x.dtype)]


@vjp("logsumexp")
def _logsumexp_vjp(ctx: VjpContext) -> list[Operand | None]:
    xv = ctx.inputs[0]
    x = _tt(xv)
    axes = wrap_dims(ctx.attrs["dims"], x.rank, "logsumexp")
    keepdim = ctx.attrs["keepdim"]
    g = _restore_dims(ctx, ctx.grad(), x, axes, keepdim)
    result = _restore_dims(ctx, ctx.outputs[0], x, axes, keepdim)
    weights = ctx.call("exp", ctx.call("sub", xv, result))
    return [_cast(ctx, ctx.call("mul", g, weights), x.dtype)]


@vjp("softmax", "log_softmax")
def _softmax_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tt(ctx.inputs[0])
    dims = (ctx.attrs["dim"],)
    ct = _opmath(_tt(ctx.outputs[0]).dtype)
    g = _cast(ctx, ctx.grad(), ct)
    y = _cast(ctx, ctx.outputs[0], ct)
    if ctx.node.op == "softmax":
        gy = ctx.call("mul", g, y)
        total = ctx.call("sum", gy, dims=dims, keepdim=True)
        dx = ctx.call("sub", gy, ctx.call("mul", y, total))
    else:
        total = ctx.call("sum", g, dims=dims, keepdim=True)
        dx = ctx.call("sub", g, ctx.call("mul", ctx.call("exp", y), total))
    return [_cast(ctx, dx, x.dtype)]


def _normalized(
    ctx: VjpContext, x: Value, axes: tuple[int, ...], eps: float
) -> tuple[Value, Value, Value]:
    """(x - mean, 1 / sqrt(var + eps), the normalized x) over ``axes``, reduced dims kept."""
    mean = ctx.call("mean", x, dims=axes, keepdim=True)
    var = ctx.call("var", x, dims=axes, correction=0, keepdim=True)
    rstd = ctx.call("rsqrt", ctx.call("add", var, eps))
    centered = ctx.call("sub", x, mean)
    return centered, rstd, ctx.call("mul", centered, rstd)


def _normalized_grad(ctx: VjpContext, gxh: Value, xhat: Value, rstd: Value, axes: tuple) -> Value:
    """The gradient of ``(x - mean) * rstd`` over ``axes`` given the cotangent ``gxh`` of it:
    ``rstd * (gxh - mean(gxh) - xhat * mean(gxh * xhat))``."""
    m1 = ctx.call("mean", gxh, dims=axes, keepdim=True)
    m2 = ctx.call("mean", ctx.call("mul", gxh, xhat), dims=axes, keepdim=True)
    inner = ctx.call("sub", ctx.call("sub", gxh, m1), ctx.call("mul", xhat, m2))
    return ctx.call("mul", rstd, inner)


def _param_grad(ctx: VjpContext, i: int, v: Value, outer: tuple[int, ...]) -> Value:
    """``v`` summed over ``outer`` (no dim kept), in the type of operand ``i``."""
    if outer:
        v = ctx.call("sum", v, dims=outer, keepdim=False)
    return _cast(ctx, v, _tt(ctx.inputs[i]).dtype)


@vjp("layer_norm")
def _layer_norm_vjp(ctx: VjpContext) -> list[Operand | None]:
    xv, w, _ = ctx.inputs
    x = _tt(xv)
    ct = _opmath(x.dtype)
    axis = x.rank - len(ctx.attrs["normalized_shape"])
    inner, outer = tuple(range(axis, x.rank)), tuple(range(axis))
    g = _cast(ctx, ctx.grad(), ct)
    xc = _cast(ctx, xv, ct)  # type: ignore[arg-type]
    _, rstd, xhat = _normalized(ctx, xc, inner, ctx.attrs["eps"])
    out: list[Operand | None] = [None, None, None]
    if ctx.wants(0):
        gxh = g if not isinstance(w, Value) else ctx.call("mul", g, _cast(ctx, w, ct))
        out[0] = _cast(ctx, _normalized_grad(ctx, gxh, xhat, rstd, inner), x.dtype)
    if ctx.wants(1):
        out[1] = _param_grad(ctx, 1, ctx.call("mul", g, xhat), outer)
    if ctx.wants(2):
        out[2] = _param_grad(ctx, 2, g, outer)
    return out


def _channels(ctx: VjpContext, v: Value, x: TensorType) -> Value:
    """A per-channel vector ``(C,)`` shaped to broadcast against ``x`` ``(N, C, *)``."""
    if x.rank == 2:
        return v
    return ctx.call("reshape", v, shape=(x.shape[1],) + (1,) * (x.rank - 2))


@vjp("group_norm")
def _group_norm_vjp(ctx: VjpContext) -> list[Operand | None]:
    xv, w, _ = ctx.inputs
    x = _tt(xv)
    ct = _opmath(x.dtype)
    groups = ctx.attrs["num_groups"]
    c = x.shape[1]
    per_group = c // groups if isinstance(c, int) else normalize(c / groups)
    if not isinstance(per_group, int) and not per_group.is_integer:
        raise TypeRuleError(
            f"group_norm: the gradient needs {c} channels in {groups} groups of a known size; "
            "specialize the channel dim"
        )
    grouped = (x.shape[0], groups, product((per_group, *x.shape[2:])))
    outer = (0, *range(2, x.rank))
    g = _cast(ctx, ctx.grad(), ct)
    xr = ctx.call("reshape", _cast(ctx, xv, ct), shape=grouped)  # type: ignore[arg-type]
    _, rstd, xhat_r = _normalized(ctx, xr, (2,), ctx.attrs["eps"])
    out: list[Operand | None] = [None, None, None]
    if ctx.wants(0):
        gxh = g
        if isinstance(w, Value):
            gxh = ctx.call("mul", g, _channels(ctx, _cast(ctx, w, ct), x))
        gxh_r = ctx.call("reshape", gxh, shape=grouped)
        dx = _normalized_grad(ctx, gxh_r, xhat_r, rstd, (2,))
        out[0] = _cast(ctx, ctx.call("reshape", dx, shape=x.shape), x.dtype)
    if ctx.wants(1):
        xhat = ctx.call("reshape", xhat_r, shape=x.shape)
        out[1] = _param_grad(ctx, 1, ctx.call("mul", g, xhat), outer)
    if ctx.wants(2):
        out[2] = _param_grad(ctx, 2, g, outer)
    return out


@vjp("batch_norm", "batch_norm_train")
def _batch_norm_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Eager's native_batch_norm_backward. The running statistics get no gradient, and no
    gradient flows back from the updated running statistics (outputs 1 and 2)."""
    xv, w, _, rm, rv = ctx.inputs
    out: list[Operand | None] = [None] * 5
    if ctx.grads[0] is None or not any(ctx.wants(i) for i in range(3)):
        return out
    x = _tt(xv)
    ct = _opmath(x.dtype)
    train = ctx.node.op == "batch_norm_train"
    if train and is_empty(xv):
        return empty_batch_zeros(ctx, [i for i in range(3) if ctx.wants(i)])
    outer = (0, *range(2, x.rank))
    eps = ctx.attrs["eps"]
    g = _cast(ctx, ctx.grad(), ct)
    xc = _cast(ctx, xv, ct)  # type: ignore[arg-type]
    if train:
        mean = ctx.call("mean", xc, dims=outer, keepdim=False)
        var = ctx.call("var", xc, dims=outer, correction=0, keepdim=False)
    else:
        assert isinstance(rm, Value) and isinstance(rv, Value)
        mean, var = _cast(ctx, rm, ct), _cast(ctx, rv, ct)
    invstd = ctx.call("rsqrt", ctx.call("add", var, eps))
    centered = ctx.call("sub", xc, _channels(ctx, mean, x))
    dot = None
    if ctx.wants(1) or (train and ctx.wants(0)):
        dot = ctx.call("sum", ctx.call("mul", g, centered), dims=outer, keepdim=False)
    gsum = None
    if ctx.wants(2) or (train and ctx.wants(0)):
        gsum = ctx.call("sum", g, dims=outer, keepdim=False)
    if ctx.wants(0):
        scale = invstd if not isinstance(w, Value) else ctx.call("mul", invstd, _cast(ctx, w, ct))
        dx = g
        if train:
            assert dot is not None and gsum is not None
            n = _count(x.shape, outer)
            # NOTE: eager's order: (g - centered * (dot / n * invstd^2) - gsum / n) * scale
            proj = ctx.call("mul", ctx.call("div", dot, n), ctx.call("mul", invstd, invstd))
            dx = ctx.call("sub", g, ctx.call("mul", centered, _channels(ctx, proj, x)))
            dx = ctx.call("sub", dx, _channels(ctx, ctx.call("div", gsum, n), x))
        out[0] = _cast(ctx, ctx.call("mul", dx, _channels(ctx, scale, x)), x.dtype)
    if ctx.wants(1):
        assert dot is not None
        out[1] = _cast(ctx, ctx.call("mul", dot, invstd), _tt(w).dtype)
    if ctx.wants(2):
        assert gsum is not None
        out[2] = _cast(ctx, gsum, _tt(ctx.inputs[2]).dtype)
    return out


nondifferentiable("all", "any", "count_nonzero")

"""Reductions and the composite ops built on them: softmax, normalizations."""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from plait.ir.graph import Operand, Value
from plait.ir.ops.registry import (
    OPTIONAL_TENSOR,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import reduce_shape, require_float, wrap_dim, wrap_dims
from plait.ir.ops.vjp import VjpContext, nondifferentiable, vjp
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, NoneType, TensorType, Type
from plait.symbolic import Dim, dims_equal, normalize, product

ALL = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)
_REDUCE_ATTRS = (Attr("dims", "ints?", None), Attr("keepdim", "bool", False))


def _reduce_ref(fn: Any) -> Any:
    """``dims=None`` reduces every dim (PyTorch spells that with no ``dim`` argument)."""

    def ref(x: torch.Tensor, dims: tuple[int, ...] | None, keepdim: bool, **kw: Any) -> Any:
        if dims is None:
            dims = tuple(range(x.dim()))
        return fn(x, dim=dims, keepdim=keepdim, **kw)

    return ref


def _sum_rule(x: TensorType, dims: Any, keepdim: bool, dtype: torch.dtype | None) -> list[Type]:
    axes = wrap_dims(dims, x.rank, "sum")
    if dtype is None:
        dtype = torch.int64 if x.dtype in (*INT_DTYPES, torch.bool) else x.dtype
    return [TensorType(reduce_shape(x.shape, axes, keepdim), dtype, x.device)]


def _mean_rule(x: TensorType, dims: Any, keepdim: bool, dtype: torch.dtype | None) -> list[Type]:
    axes = wrap_dims(dims, x.rank, "mean")
    out = dtype or x.dtype
    if out not in FLOAT_DTYPES:
        raise TypeRuleError(f"mean: needs a floating-point dtype, got {out}")
    return [TensorType(reduce_shape(x.shape, axes, keepdim), out, x.device)]


def _minmax_rule(name: str) -> Any:
    def rule(x: TensorType, dims: Any, keepdim: bool) -> list[Type]:
        axes = wrap_dims(dims, x.rank, name)
        for a in axes:
            if dims_equal(x.shape[a], 0):
                raise TypeRuleError(f"{name}: cannot reduce over the empty dim {a}")
        return [TensorType(reduce_shape(x.shape, axes, keepdim), x.dtype, x.device)]

    return rule


def _var_rule(x: TensorType, dims: Any, correction: Any, keepdim: bool) -> list[Type]:
    require_float(x, "var")
    axes = wrap_dims(dims, x.rank, "var")
    return [TensorType(reduce_shape(x.shape, axes, keepdim), x.dtype, x.device)]


_DTYPE = (Attr("dtype", "dtype?", None),)
register(
    OpDef(
        "sum",
        Category.REDUCTION,
        (Param("x"),),
        _REDUCE_ATTRS + _DTYPE,
        _sum_rule,
        _reduce_ref(torch.sum),
        ALL,
    )
)
register(
    OpDef(
        "mean",
        Category.REDUCTION,
        (Param("x"),),
        _REDUCE_ATTRS + _DTYPE,
        _mean_rule,
        _reduce_ref(torch.mean),
        FLOAT_DTYPES,
    )
)
register(
    OpDef(
        "amax",
        Category.REDUCTION,
        (Param("x"),),
        _REDUCE_ATTRS,
        _minmax_rule("amax"),
        _reduce_ref(torch.amax),
        ALL,
    )
)
register(
    OpDef(
        "amin",
        Category.REDUCTION,
        (Param("x"),),
        _REDUCE_ATTRS,
        _minmax_rule("amin"),
        _reduce_ref(torch.amin),
        ALL,
    )
)
register(
    OpDef(
        "var",
        Category.REDUCTION,
        (Param("x"),),
        (
            Attr("dims", "ints?", None),
            Attr("correction", "scalar", 1),
            Attr("keepdim", "bool", False),
        ),
        _var_rule,
        _reduce_ref(torch.var),
        FLOAT_DTYPES,
    )
)


# --- logical, counting and product reductions ------------------------------------------------
def _logical_rule(name: str) -> Any:
    def rule(x: TensorType, dims: Any, keepdim: bool) -> list[Type]:
        axes = wrap_dims(dims, x.rank, name)
        # NOTE: eager's all/any keep uint8 as uint8; every other dtype gives bool.
        out = torch.uint8 if x.dtype == torch.uint8 else torch.bool
        return [TensorType(reduce_shape(x.shape, axes, keepdim), out, x.device)]

    return rule


for _name, _fn in (("all", torch.all), ("any", torch.any)):
    register(
        OpDef(
            _name,
            Category.REDUCTION,
            (Param("x"),),
            _REDUCE_ATTRS,
            _logical_rule(_name),
            _reduce_ref(_fn),
            ALL,
            "NaN counts as true; over no elements all is true, any false",
        )
    )


def _count_nonzero_rule(x: TensorType, dims: Any) -> list[Type]:
    axes = wrap_dims(dims, x.rank, "count_nonzero")
    return [TensorType(reduce_shape(x.shape, axes, False), torch.int64, x.device)]


register(
    OpDef(
        "count_nonzero",
        Category.REDUCTION,
        (Param("x"),),
        (Attr("dims", "ints?", None),),
        _count_nonzero_rule,
        lambda x, dims: torch.count_nonzero(x, dim=tuple(range(x.dim())) if dims is None else dims),
        ALL,
    )
)
# NOTE: eager's nansum accumulates 16-bit floats in their own precision (its sum in float32),
# less accurately than the contract lets plait be compared: those stay PyTorch's.
_NANSUM_DTYPES = tuple(d for d in ALL if d not in (torch.bfloat16, torch.float16))


def _nansum_rule(x: TensorType, dims: Any, keepdim: bool, dtype: torch.dtype | None) -> list[Type]:
    if x.dtype not in _NANSUM_DTYPES or (dtype is not None and dtype not in _NANSUM_DTYPES):
        raise TypeRuleError(f"nansum: {x.dtype} accumulates in 16 bits in eager; not an IR op")
    return _sum_rule(x, dims, keepdim, dtype)


register(
    OpDef(
        "nansum",
        Category.REDUCTION,
        (Param("x"),),
        _REDUCE_ATTRS + _DTYPE,
        _nansum_rule,
        _reduce_ref(torch.nansum),
        _NANSUM_DTYPES,
        "sum with NaN elements counted as zero",
    )
)


def _prod_rule(x: TensorType, dims: Any, keepdim: bool, dtype: torch.dtype | None) -> list[Type]:
    if dims is not None and len(dims) != 1:
        raise TypeRuleError("prod: reduces one dim or all of them")
    return _sum_rule(x, dims, keepdim, dtype)


def _prod_ref(x: torch.Tensor, dims: Any, keepdim: bool, dtype: torch.dtype | None) -> Any:
    if dims is None:
        out = torch.prod(x, dtype=dtype)
        return out.reshape([1] * x.dim()) if keepdim else out
    return torch.prod(x, dims[0], keepdim=keepdim, dtype=dtype)


register(
    OpDef(
        "prod",
        Category.REDUCTION,
        (Param("x"),),
        _REDUCE_ATTRS + _DTYPE,
        _prod_rule,
        _prod_ref,
        ALL,
    )
)


def _logsumexp_rule(x: TensorType, dims: Any, keepdim: bool) -> list[Type]:
    if not dims and x.rank:
        raise TypeRuleError("logsumexp: needs the dims to reduce")
    axes = wrap_dims(dims, x.rank, "logsumexp")
    out = x.dtype if x.dtype in FLOAT_DTYPES else torch.float32
    return [TensorType(reduce_shape(x.shape, axes, keepdim), out, x.device)]


register(
    OpDef(
        "logsumexp",
        Category.REDUCTION,
        (Param("x"),),
        (Attr("dims", "ints"), Attr("keepdim", "bool", False)),
        _logsumexp_rule,
        lambda x, dims, keepdim: torch.logsumexp(x, dims or (0,), keepdim=keepdim),
        ALL,
        "log(sum(exp(x - m))) + m, m the max where finite, else 0 (integers in float32)",
    )
)


# --- softmax family ------------------------------------------------------------------------
def _softmax_rule(name: str) -> Any:
    def rule(x: TensorType, dim: int, dtype: torch.dtype | None) -> list[Type]:
        wrap_dim(dim, x.rank, name)
        out = dtype or x.dtype
        if out not in FLOAT_DTYPES:
            raise TypeRuleError(f"{name}: needs a floating-point dtype, got {out}")
        return [x.with_dtype(out)]

    return rule


_SOFTMAX_ATTRS = (Attr("dim", "int"), Attr("dtype", "dtype?", None))
register(
    OpDef(
        "softmax",
        Category.REDUCTION,
        (Param("x"),),
        _SOFTMAX_ATTRS,
        _softmax_rule("softmax"),
        lambda x, dim, dtype: F.softmax(x, dim=dim, dtype=dtype),
        FLOAT_DTYPES,
    )
)
register(
    OpDef(
        "log_softmax",
        Category.REDUCTION,
        (Param("x"),),
        _SOFTMAX_ATTRS,
        _softmax_rule("log_softmax"),
        lambda x, dim, dtype: F.log_softmax(x, dim=dim, dtype=dtype),
        FLOAT_DTYPES,
    )
)


# --- normalizations ------------------------------------------------------------------------
def _check_param(name: str, what: str, t: Type, shape: tuple[Dim, ...], x: TensorType) -> None:
    if isinstance(t, NoneType):
        return
    assert isinstance(t, TensorType)
    if len(t.shape) != len(shape) or not all(dims_equal(a, b) for a, b in zip(t.shape, shape)):
        raise TypeRuleError(f"{name}: {what} has shape {list(t.shape)}, expected {list(shape)}")
    if t.device != x.device:
        raise TypeRuleError(f"{name}: {what} is on {t.device}, input on {x.device}")


def _layer_norm_rule(
    x: TensorType, weight: Type, bias: Type, normalized_shape: tuple, eps: float
) -> list[Type]:
    require_float(x, "layer_norm")
    n = len(normalized_shape)
    if (
        n == 0
        or n > x.rank
        or not all(dims_equal(a, b) for a, b in zip(x.shape[x.rank - n :], normalized_shape))
    ):
        raise TypeRuleError(
            f"layer_norm: normalized_shape {list(normalized_shape)} does not match the trailing "
            f"dims of {x}"
        )
    _check_param("layer_norm", "weight", weight, tuple(normalized_shape), x)
    _check_param("layer_norm", "bias", bias, tuple(normalized_shape), x)
    return [x]


register(
    OpDef(
        "layer_norm",
        Category.REDUCTION,
        (Param("x"), Param("weight", OPTIONAL_TENSOR), Param("bias", OPTIONAL_TENSOR)),
        (Attr("normalized_shape", "dims"), Attr("eps", "float", 1e-5)),
        _layer_norm_rule,
        lambda x, w, b, normalized_shape, eps: F.layer_norm(x, normalized_shape, w, b, eps),
        FLOAT_DTYPES,
    )
)


def _group_norm_rule(
    x: TensorType, weight: Type, bias: Type, num_groups: int, eps: float
) -> list[Type]:
    require_float(x, "group_norm")
    if x.rank < 2:
        raise TypeRuleError(f"group_norm: expects rank >= 2 (N, C, ...), got {x}")
    c = x.shape[1]
    if isinstance(c, int) and (num_groups <= 0 or c % num_groups):
        raise TypeRuleError(f"group_norm: {c} channels do not split into {num_groups} groups")
    _check_param("group_norm", "weight", weight, (c,), x)
    _check_param("group_norm", "bias", bias, (c,), x)
    return [x]


register(
    OpDef(
        "group_norm",
        Category.REDUCTION,
        (Param("x"), Param("weight", OPTIONAL_TENSOR), Param("bias", OPTIONAL_TENSOR)),
        (Attr("num_groups", "int"), Attr("eps", "float", 1e-5)),
        _group_norm_rule,
        lambda x, w, b, num_groups, eps: F.group_norm(x, num_groups, w, b, eps),
        FLOAT_DTYPES,
    )
)

_BN_PARAMS = (
    Param("x"),
    Param("weight", OPTIONAL_TENSOR),
    Param("bias", OPTIONAL_TENSOR),
    Param("running_mean", OPTIONAL_TENSOR),
    Param("running_var", OPTIONAL_TENSOR),
)


def _bn_common(name: str, x: TensorType, *params: Type) -> None:
    require_float(x, name)
    if x.rank < 2:
        raise TypeRuleError(f"{name}: expects rank >= 2 (N, C, ...), got {x}")
    for what, t in zip(("weight", "bias", "running_mean", "running_var"), params):
        _check_param(name, what, t, (x.shape[1],), x)


def _bn_eval_rule(x: TensorType, w: Type, b: Type, rm: Type, rv: Type, eps: float) -> list[Type]:
    _bn_common("batch_norm", x, w, b, rm, rv)
    if isinstance(rm, NoneType) or isinstance(rv, NoneType):
        raise TypeRuleError("batch_norm: inference semantics need running_mean and running_var")
    return [x]


def _bn_eval_ref(x: Any, w: Any, b: Any, rm: Any, rv: Any, eps: float) -> Any:
    return F.batch_norm(x, rm, rv, w, b, training=False, eps=eps)


register(
    OpDef(
        "batch_norm",
        Category.REDUCTION,
        _BN_PARAMS,
        (Attr("eps", "float", 1e-5),),
        _bn_eval_rule,
        _bn_eval_ref,
        FLOAT_DTYPES,
        "inference semantics: normalize with the running statistics",
    )
)


def _bn_train_rule(
    x: TensorType, w: Type, b: Type, rm: Type, rv: Type, momentum: float | None, eps: float
) -> list[Type]:
    _bn_common("batch_norm_train", x, w, b, rm, rv)
    if isinstance(rm, NoneType) != isinstance(rv, NoneType):
        raise TypeRuleError("batch_norm_train: give both running stats or neither")
    if isinstance(rm, TensorType) and isinstance(rv, TensorType):
        return [x, rm, rv]
    return [x]


def _bn_train_ref(
    x: Any, w: Any, b: Any, rm: Any, rv: Any, momentum: float | None, eps: float
) -> Any:
    """Functional: returns the output and the updated running stats (inputs are not mutated).

    NOTE: ``momentum=None`` means a cumulative average, which PyTorch's module computes by passing
    ``1/num_batches_tracked``; capture resolves that into a float before it gets here.
    """
    if rm is None:
        return F.batch_norm(x, None, None, w, b, training=True, eps=eps)
    new_rm, new_rv = rm.clone(), rv.clone()
    y = F.batch_norm(x, new_rm, new_rv, w, b, training=True, momentum=momentum or 0.0, eps=eps)
    return (y, new_rm, new_rv)


register(
    OpDef(
        "batch_norm_train",
        Category.REDUCTION,
        _BN_PARAMS,
        (Attr("momentum", "float", 0.1), Attr("eps", "float", 1e-5)),
        _bn_train_rule,
        _bn_train_ref,
        FLOAT_DTYPES,
        "training semantics: batch statistics; outputs (y, new_running_mean, "
        "new_running_var) when running stats are given, else (y,)",
        fixed_outputs=None,
    )
)


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

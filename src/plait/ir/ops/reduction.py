"""Reductions and the composite ops built on them: softmax, normalizations (type rules and
references; derivatives in :mod:`plait.ir.ops.reduction_derivatives`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plait.ir.ops.registry import (
    OPTIONAL_TENSOR,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import float_dtype, reduce_shape, require_float, wrap_dim, wrap_dims
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, NoneType, TensorType, Type
from plait.symbolic import Dim, dims_equal

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
    out = float_dtype(x.dtype)
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

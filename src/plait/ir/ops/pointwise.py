"""Pointwise ops: unary math, binary arithmetic and comparisons, where, clamp, casts, masks and
activations: their type rules and references (derivatives: :mod:`plait.ir.ops.unary_derivatives`,
:mod:`plait.ir.ops.binary_derivatives`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

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
from plait.ir.ops.rules import (
    broadcast_shapes,
    device_of,
    float_dtype,
    promote,
    promoted_float,
    require_float,
)
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
    dtype = promoted_float(dtype, x)
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

"""Rules for pointwise math, comparisons, casts, reductions, softmax and matmul.

NOTE: operands keep eager's order and Python scalars stay literals, so the IR's type rules (which
ask ``torch.result_type``) and reference implementations compute exactly what eager does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from plait.frontend.table import InPlace, NoIROp, Viewed, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep
from plait.ir import TensorType, Value

T = torch.Tensor


def _fns(owner: Any, *names: str) -> list[Any]:
    return [getattr(owner, n) for n in names if hasattr(owner, n)]


def _both(*names: str) -> list[Any]:
    return _fns(torch, *names) + _fns(T, *names)


def _dtype_of(v: Value) -> torch.dtype:
    assert isinstance(v.type, TensorType)
    return v.type.dtype


# --- unary -----------------------------------------------------------------------------------
_UNARY = {
    "relu": ("relu",),
    "sigmoid": ("sigmoid",),
    "tanh": ("tanh",),
    "exp": ("exp",),
    "log": ("log",),
    "sqrt": ("sqrt",),
    "rsqrt": ("rsqrt",),
    "erf": ("erf",),
    "reciprocal": ("reciprocal",),
    "neg": ("neg", "negative"),
    "abs": ("abs", "absolute"),
    "logical_not": ("logical_not",),
    "sin": ("sin",),
    "cos": ("cos",),
    "tan": ("tan",),
    "asin": ("asin", "arcsin"),
    "acos": ("acos", "arccos"),
    "atan": ("atan", "arctan"),
    "sinh": ("sinh",),
    "cosh": ("cosh",),
    "asinh": ("asinh", "arcsinh"),
    "acosh": ("acosh", "arccosh"),
    "atanh": ("atanh", "arctanh"),
    "expm1": ("expm1",),
    "log1p": ("log1p",),
    "log2": ("log2",),
    "log10": ("log10",),
    "exp2": ("exp2",),
    "erfc": ("erfc",),
    "floor": ("floor",),
    "ceil": ("ceil",),
    "trunc": ("trunc", "fix"),
    "frac": ("frac",),
    "sign": ("sign", "sgn"),
    "bitwise_not": ("bitwise_not",),
}
# NOTE: torch.special's spellings of the same ops (separate callables, no in-place forms).
_SPECIAL = {"expm1": "expm1", "log1p": "log1p", "exp2": "exp2", "erfc": "erfc", "erf": "erf"}
_PREDICATES = ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit")


def _unary(ir_op: str, names: tuple[str, ...]) -> None:
    def emit(cx: CaptureContext, out: Any, x: Any, *_: Any) -> Value:
        v: Value = cx.call(ir_op, cx.value(x))
        return v

    op(*_both(*names))(emit)
    op(*_both(*(n + "_" for n in names)), inplace=True)(emit)


for _ir, _names in _UNARY.items():
    _unary(_ir, _names)
for _ir, _name in _SPECIAL.items():
    op(*_fns(torch.special, _name))(lambda cx, out, x, _ir=_ir: cx.call(_ir, cx.value(x)))
for _name in _PREDICATES:
    op(*_both(_name))(lambda cx, out, x, _ir=_name: cx.call(_ir, cx.value(x)))


def _nan_to_num(
    cx: CaptureContext,
    out: Any,
    x: Any,
    nan: float | None = 0.0,
    posinf: float | None = None,
    neginf: float | None = None,
) -> Value:
    def opt(v: Any) -> float | None:
        return None if v is None else float(v)

    if any(v is not None and math.isnan(float(v)) for v in (nan, posinf, neginf)):
        # NOTE: kernels write the canonical NaN; eager keeps a NaN replacement's sign and payload
        raise NoIROp("nan_to_num with a NaN replacement keeps its bits only in PyTorch's kernel")

    v: Value = cx.call(
        "nan_to_num", cx.value(x), nan=float(nan or 0.0), posinf=opt(posinf), neginf=opt(neginf)
    )
    return v


op(*_both("nan_to_num"))(_nan_to_num)
op(T.nan_to_num_, *_fns(torch, "nan_to_num_"), inplace=True)(_nan_to_num)


def _round(cx: CaptureContext, out: Any, x: Any, *, decimals: Any = 0) -> Value:
    v: Value = cx.call("round", cx.value(x), decimals=cx.int(decimals))
    return v


op(*_both("round"), *_fns(torch.special, "round"))(_round)
op(T.round_, *_fns(torch, "round_"), inplace=True)(_round)


@op(*_both("square"))
def _square(cx: CaptureContext, out: Any, x: Any) -> Value:
    # NOTE: eager's square is pow(x, 2) (bool squares to int64, as pow does).
    v: Value = cx.call("pow", cx.value(x), 2)
    return v


op(T.square_, inplace=True)(_square)


@op(*_both("positive"))
def _positive(cx: CaptureContext, out: Any, x: Any) -> Viewed:
    """``positive`` returns its argument itself."""
    return Viewed(cx.value(x), x, (ViewStep("identity"),))


# NOTE: ATen multiplies by these constants as wrapped double scalars (integers give the default
# float dtype, as ``int * float`` does); the literals are ATen's.
_RADIANS_PER_DEGREE = float("0.017453292519943295769236907684886127134428718885417")
_DEGREES_PER_RADIAN = float("57.295779513082320876798154814105170332405472466564")


def _scale_by(factor: float) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any) -> Value:
        v: Value = cx.call("mul", cx.value(x), factor)
        return v

    return emit


op(*_both("deg2rad"))(_scale_by(_RADIANS_PER_DEGREE))
op(*_both("rad2deg"))(_scale_by(_DEGREES_PER_RADIAN))
op(T.deg2rad_, *_fns(torch, "deg2rad_"), inplace=True)(_scale_by(_RADIANS_PER_DEGREE))
op(T.rad2deg_, *_fns(torch, "rad2deg_"), inplace=True)(_scale_by(_DEGREES_PER_RADIAN))

op(F.sigmoid)(lambda cx, out, x: cx.call("sigmoid", cx.value(x)))
op(F.tanh)(lambda cx, out, x: cx.call("tanh", cx.value(x)))


@op(T.__invert__)
def _invert(cx: CaptureContext, out: Any, x: Any) -> Value:
    v = cx.value(x)
    out_v: Value = cx.call("logical_not" if _dtype_of(v) == torch.bool else "bitwise_not", v)
    return out_v


def _maybe_inplace(x: Any, v: Value, inplace: bool) -> Any:
    return InPlace(x, v) if inplace else v


@op(F.relu)
def _f_relu(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    return _maybe_inplace(x, cx.call("relu", cx.value(x)), inplace)


@op(F.silu)
def _f_silu(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    return _maybe_inplace(x, cx.call("silu", cx.value(x)), inplace)


@op(F.gelu)
def _f_gelu(cx: CaptureContext, out: Any, x: Any, approximate: str = "none") -> Value:
    v: Value = cx.call("gelu", cx.value(x), approximate=approximate)
    return v


@op(F.hardtanh)
def _f_hardtanh(
    cx: CaptureContext,
    out: Any,
    x: Any,
    min_val: float = -1.0,
    max_val: float = 1.0,
    inplace: bool = False,
) -> Any:
    v = cx.call("clamp", cx.value(x), min=float(min_val), max=float(max_val))
    return _maybe_inplace(x, v, inplace)


# --- binary ----------------------------------------------------------------------------------
def _bin(cx: CaptureContext, ir_op: str, a: Any, b: Any, **attrs: Any) -> Value:
    v: Value = cx.call(ir_op, cx.operand(a), cx.operand(b), **attrs)
    return v


def _binary(
    ir_op: str,
    funcs: list[Any],
    inplace: list[Any],
    reflected: list[Any] = (),  # type: ignore[assignment]
    alpha: bool = False,
) -> None:
    def emit(cx: CaptureContext, out: Any, a: Any, b: Any, *, alpha: Any = 1) -> Value:
        attrs = {"alpha": cx.operand(alpha)} if ir_op in ("add", "sub") else {}
        return _bin(cx, ir_op, a, b, **attrs)

    def emit_reflected(cx: CaptureContext, out: Any, a: Any, b: Any) -> Value:
        return _bin(cx, ir_op, b, a)

    op(*funcs)(emit)
    op(*inplace, inplace=True)(emit)
    if reflected:
        op(*reflected)(emit_reflected)


_binary("add", [*_both("add"), T.__add__, T.__radd__], [T.add_, T.__iadd__])
_binary(
    "sub", [*_both("sub", "subtract"), T.__sub__], [T.sub_, T.subtract_, T.__isub__], [T.__rsub__]
)
_binary(
    "mul", [*_both("mul", "multiply"), T.__mul__, T.__rmul__], [T.mul_, T.multiply_, T.__imul__]
)
_binary("pow", [*_both("pow"), T.__pow__], [T.pow_, T.__ipow__], [T.__rpow__])
_binary("maximum", _both("maximum"), [])
_binary("minimum", _both("minimum"), [])
for _ir, _names in {
    "eq": ("eq",),
    "ne": ("ne", "not_equal"),
    "lt": ("lt", "less"),
    "le": ("le", "less_equal"),
    "gt": ("gt", "greater"),
    "ge": ("ge", "greater_equal"),
}.items():
    _binary(_ir, [*_both(*_names), getattr(T, f"__{_ir}__")], [])
_binary("logical_and", _both("logical_and"), [])
_binary("logical_or", _both("logical_or"), [])
_binary("logical_xor", _both("logical_xor"), [T.logical_xor_])
_binary("atan2", _both("atan2", "arctan2"), [T.atan2_, T.arctan2_])
_binary("hypot", _both("hypot"), [T.hypot_])
_binary("copysign", _both("copysign"), [T.copysign_])
_binary("fmod", _both("fmod"), [T.fmod_])
_binary("remainder", [*_both("remainder"), T.__mod__], [T.remainder_, T.__imod__], [T.__rmod__])
_binary("fmax", _both("fmax"), [])
_binary("fmin", _both("fmin"), [])
_binary("xlogy", [*_both("xlogy"), *_fns(torch.special, "xlogy")], [T.xlogy_])
for _kind in ("and", "or", "xor"):
    _binary(
        f"bitwise_{_kind}",
        _both(f"bitwise_{_kind}"),
        [getattr(T, f"bitwise_{_kind}_"), getattr(T, f"__i{_kind}__")],
    )


@op(torch.rsub)
def _rsub(cx: CaptureContext, out: Any, x: Any, other: Any, alpha: Any = 1) -> Value:
    return _bin(cx, "sub", other, x, alpha=cx.operand(alpha))


def _div(
    cx: CaptureContext, out: Any, a: Any, b: Any, *, rounding_mode: str | None = None
) -> Value:
    return _bin(cx, "div", a, b, rounding_mode=rounding_mode)


op(*_both("div", "divide", "true_divide"), T.__truediv__, T.__div__)(_div)
op(T.div_, T.divide_, T.true_divide_, T.__itruediv__, inplace=True)(_div)
op(*_both("floor_divide"), T.__floordiv__)(
    lambda cx, out, a, b: _bin(cx, "div", a, b, rounding_mode="floor")
)
op(T.floor_divide_, T.__ifloordiv__, inplace=True)(
    lambda cx, out, a, b: _bin(cx, "div", a, b, rounding_mode="floor")
)


@op(T.__rtruediv__)
def _rdiv(cx: CaptureContext, out: Any, x: Any, other: Any) -> Value:
    # NOTE: eager computes `other / x` as `x.reciprocal() * other` (torch/_tensor.py).
    v: Value = cx.call("mul", cx.call("reciprocal", cx.value(x)), cx.operand(other))
    return v


@op(T.__and__, T.__rand__, T.__or__, T.__ror__, T.__xor__, T.__rxor__)
def _bitwise_operator(cx: CaptureContext, out: Any, a: Any, b: Any) -> Value:
    """``a & b``, ``a | b``, ``a ^ b`` and their reflections (these commute: ``a`` is the
    tensor); on bools the logical ops."""
    kind = cx.current.rsplit(".", 1)[-1].strip("_").removeprefix("r")
    if out.dtype == torch.bool and kind != "xor" and isinstance(b, T):
        return _bin(cx, f"logical_{kind}", a, b)
    return _bin(cx, f"bitwise_{kind}", a, b)


# --- select, clamp, casts ----------------------------------------------------------------
@op(*_both("where"))
def _where(cx: CaptureContext, out: Any, cond: Any, a: Any = None, b: Any = None) -> Value:
    if a is None or b is None:
        cx.fail(
            "data-dependent",
            "torch.where(condition) returns the indices of true "
            "elements: its output shape depends on the values",
        )
    if cx.current == "Tensor.where":  # x.where(cond, y) is torch.where(cond, x, y)
        cond, a = a, cond
    v: Value = cx.call("where", cx.value(cond), cx.operand(a), cx.operand(b))
    return v


def _masked_fill(cx: CaptureContext, out: Any, x: Any, mask: Any, value: Any) -> Value:
    vx = cx.value(x)
    dtype = _dtype_of(vx)
    if isinstance(value, T):
        fill: Any = cx.value(value)
        if _dtype_of(fill) != dtype:
            fill = cx.call("to_dtype", fill, dtype=dtype)
    else:
        # NOTE: masked_fill converts the scalar to x's dtype first; so do we.
        fill = cx.operand(value)
        if dtype == torch.bool:
            fill = bool(fill)
        elif not dtype.is_floating_point:
            fill = int(fill)
    v: Value = cx.call("where", cx.value(mask), fill, vx)
    if _dtype_of(v) != dtype:
        v = cx.call("to_dtype", v, dtype=dtype)
    return v


op(*_both("masked_fill"))(_masked_fill)
op(T.masked_fill_, inplace=True)(_masked_fill)


def _clamp(cx: CaptureContext, out: Any, x: Any, min: Any = None, max: Any = None) -> Value:
    v = cx.value(x)
    if isinstance(min, T) or isinstance(max, T):
        for bound, name in ((min, "maximum"), (max, "minimum")):
            if bound is None:
                continue
            other = (
                cx.value(bound)
                if isinstance(bound, T)
                else cx.call(
                    "full",
                    shape=(),
                    dtype=_dtype_of(v),
                    device=str(v.type.device),  # type: ignore[union-attr]
                    value=cx.operand(bound),
                )
            )
            v = cx.call(name, v, other)
        return v
    out_v: Value = cx.call("clamp", v, min=cx.operand(min), max=cx.operand(max))
    return out_v


op(*_both("clamp", "clip"))(_clamp)
op(T.clamp_, T.clip_, *_fns(torch, "clamp_", "clip_"), inplace=True)(_clamp)
op(*_both("clamp_min"))(lambda cx, out, x, m: _clamp(cx, out, x, min=m))
op(*_both("clamp_max"))(lambda cx, out, x, m: _clamp(cx, out, x, max=m))
op(T.clamp_min_, inplace=True)(lambda cx, out, x, m: _clamp(cx, out, x, min=m))
op(T.clamp_max_, inplace=True)(lambda cx, out, x, m: _clamp(cx, out, x, max=m))


def _convert(cx: CaptureContext, out: Any, x: Any) -> Any:
    """A dtype conversion decided by PyTorch (``out``); a no-op conversion returns ``x`` itself,
    which stays an alias of ``x``."""
    if not isinstance(out, T):
        return out  # Tensor.type() with no argument returns a string
    tr = cx.tracer(x)
    v = cx.value(tr)
    if out.device != tr._plain.device:
        cx.limitation(
            f"moving a tensor from {tr._plain.device} to {out.device} inside the "
            "program has no IR op"
        )
    if out.dtype != _dtype_of(v):
        v = cx.call("to_dtype", v, dtype=out.dtype)
    return Viewed(v, x, (ViewStep("identity"),))


_CASTS = [
    "float",
    "double",
    "half",
    "bfloat16",
    "int",
    "long",
    "short",
    "bool",
    "byte",
    "char",
    "to",
    "type",
    "type_as",
    "cpu",
    "cuda",
]
op(*_fns(T, *_CASTS))(lambda cx, out, x, *args, **kwargs: _convert(cx, out, x))


def _tri(name: str) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any, diagonal: Any = 0) -> Value:
        v: Value = cx.call(name, cx.value(x), diagonal=cx.int(diagonal))
        return v

    return emit


op(*_both("triu"))(_tri("triu"))
op(*_both("tril"))(_tri("tril"))
op(T.triu_, inplace=True)(_tri("triu"))
op(T.tril_, inplace=True)(_tri("tril"))


# --- reductions ------------------------------------------------------------------------
def _dims(cx: CaptureContext, dim: Any) -> tuple[int, ...] | None:
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return tuple(cx.int(d) for d in dim) or None
    return (cx.int(dim),)


def _reduce(name: str) -> Any:
    def emit(
        cx: CaptureContext,
        out: Any,
        x: Any,
        dim: Any = None,
        keepdim: bool = False,
        *,
        dtype: torch.dtype | None = None,
    ) -> Value:
        v: Value = cx.call(
            name, cx.value(x), dims=_dims(cx, dim), keepdim=bool(keepdim), dtype=dtype
        )
        return v

    return emit


op(*_both("sum"))(_reduce("sum"))
op(*_both("mean"))(_reduce("mean"))


@op(*_both("nansum"))
def _nansum(cx: CaptureContext, out: Any, x: Any, *args: Any, **kwargs: Any) -> Value:
    if out.dtype in (torch.bfloat16, torch.float16) or _dtype_of(cx.value(x)) in (
        torch.bfloat16,
        torch.float16,
    ):
        raise NoIROp("nansum of 16-bit floats accumulates in 16 bits in eager")
    v: Value = _reduce("nansum")(cx, out, x, *args, **kwargs)
    return v


def _logical_reduce(name: str) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any, dim: Any = None, keepdim: bool = False) -> Value:
        if isinstance(dim, (list, tuple)) and len(dim) == 0:
            raise NoIROp(f"{name}(dim=()) reduces no dim")
        v: Value = cx.call(name, cx.value(x), dims=_dims(cx, dim), keepdim=bool(keepdim))
        return v

    return emit


op(*_both("all"))(_logical_reduce("all"))
op(*_both("any"))(_logical_reduce("any"))


@op(*_both("count_nonzero"))
def _count_nonzero(cx: CaptureContext, out: Any, x: Any, dim: Any = None) -> Value:
    v: Value = cx.call("count_nonzero", cx.value(x), dims=_dims(cx, dim))
    return v


@op(*_both("prod"))
def _prod(
    cx: CaptureContext,
    out: Any,
    x: Any,
    dim: Any = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Value:
    if isinstance(dim, torch.dtype):  # prod(x, dtype) positionally
        dim, dtype = None, dim
    v: Value = cx.call("prod", cx.value(x), dims=_dims(cx, dim), keepdim=bool(keepdim), dtype=dtype)
    return v


@op(*_both("logsumexp"), *_fns(torch.special, "logsumexp"))
def _logsumexp(cx: CaptureContext, out: Any, x: Any, dim: Any, keepdim: bool = False) -> Value:
    dims = _dims(cx, dim)
    if dims is None:
        raise NoIROp("logsumexp(dim=()) has no IR op")
    v: Value = cx.call("logsumexp", cx.value(x), dims=dims, keepdim=bool(keepdim))
    return v


def _amax(name: str) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any, dim: Any = (), keepdim: bool = False) -> Value:
        v: Value = cx.call(name, cx.value(x), dims=_dims(cx, dim), keepdim=bool(keepdim))
        return v

    return emit


op(*_both("amax"))(_amax("amax"))
op(*_both("amin"))(_amax("amin"))


def _max(reduce: str, pointwise: str) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any, *args: Any, **kwargs: Any) -> Value:
        other = args[0] if args else kwargs.get("other")
        if isinstance(other, T):
            return _bin(cx, pointwise, x, other)
        if args or kwargs:
            raise NoIROp(
                f"{reduce[1:]}(dim) also returns indices; there is no IR op for arg{reduce[1:]}"
            )
        v: Value = cx.call(reduce, cx.value(x), dims=None, keepdim=False)
        return v

    return emit


op(*_both("max"))(_max("amax", "maximum"))
op(*_both("min"))(_max("amin", "minimum"))


@op(*_both("var"))
def _var(
    cx: CaptureContext,
    out: Any,
    x: Any,
    *args: Any,
    dim: Any = None,
    unbiased: bool | None = None,
    correction: Any = None,
    keepdim: bool = False,
) -> Value:
    rest = list(args)
    if rest and isinstance(rest[0], bool):
        unbiased = rest.pop(0)
    elif rest:
        dim = rest.pop(0)
        if rest:
            unbiased = rest.pop(0)
        if rest:
            keepdim = rest.pop(0)
    if correction is None:
        correction = 0 if unbiased is False else 1
    v: Value = cx.call(
        "var",
        cx.value(x),
        dims=_dims(cx, dim),
        correction=cx.operand(correction),
        keepdim=bool(keepdim),
    )
    return v


def _softmax(name: str) -> Any:
    def emit(
        cx: CaptureContext,
        out: Any,
        x: Any,
        dim: Any = None,
        *rest: Any,
        dtype: torch.dtype | None = None,
        _stacklevel: int = 3,
    ) -> Value:
        if rest and isinstance(rest[-1], torch.dtype):
            dtype = rest[-1]
        if dim is None:
            cx.limitation(f"{name} without dim (the implicit dim is deprecated)")
        v: Value = cx.call(name, cx.value(x), dim=cx.int(dim), dtype=dtype)
        return v

    return emit


op(F.softmax, *_both("softmax"))(_softmax("softmax"))
op(F.log_softmax, *_both("log_softmax"))(_softmax("log_softmax"))


# --- matmul --------------------------------------------------------------------------------
op(*_both("matmul", "mm"), T.__matmul__)(lambda cx, out, a, b: _bin(cx, "matmul", a, b))
op(T.__rmatmul__)(lambda cx, out, a, b: _bin(cx, "matmul", b, a))
op(*_both("bmm"))(lambda cx, out, a, b: _bin(cx, "bmm", a, b))

"""Rules for pointwise math, comparisons, casts and matmul (reductions and softmax:
:mod:`plait.frontend.lower_reduction`).

NOTE: operands keep eager's order and Python scalars stay literals, so the IR's type rules (which
ask ``torch.result_type``) and reference implementations compute exactly what eager does.
"""

from __future__ import annotations

import json
import math
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from plait.frontend.lower_common import T, both, call_binary, dtype_of, fns
from plait.frontend.table import InPlace, NoIROp, Viewed, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep
from plait.ir import Value

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

    op(*both(*names))(emit)
    op(*both(*(n + "_" for n in names)), inplace=True)(emit)


for _ir, _names in _UNARY.items():
    _unary(_ir, _names)
for _ir, _name in _SPECIAL.items():
    op(*fns(torch.special, _name))(lambda cx, out, x, _ir=_ir: cx.call(_ir, cx.value(x)))
for _name in _PREDICATES:
    op(*both(_name))(lambda cx, out, x, _ir=_name: cx.call(_ir, cx.value(x)))


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
        "nan_to_num",
        cx.value(x),
        nan=0.0 if nan is None else float(nan),  # NOTE: not ``nan or 0.0``: -0.0 is falsy
        posinf=opt(posinf),
        neginf=opt(neginf),
    )
    return v


op(*both("nan_to_num"))(_nan_to_num)
op(T.nan_to_num_, *fns(torch, "nan_to_num_"), inplace=True)(_nan_to_num)


def _round(cx: CaptureContext, out: Any, x: Any, *, decimals: Any = 0) -> Value:
    v: Value = cx.call("round", cx.value(x), decimals=cx.int(decimals))
    return v


op(*both("round"), *fns(torch.special, "round"))(_round)
op(T.round_, *fns(torch, "round_"), inplace=True)(_round)


@op(*both("square"))
def _square(cx: CaptureContext, out: Any, x: Any) -> Value:
    # NOTE: eager's square is pow(x, 2) (bool squares to int64, as pow does).
    v: Value = cx.call("pow", cx.value(x), 2)
    return v


op(T.square_, inplace=True)(_square)


@op(*both("positive"))
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


op(*both("deg2rad"))(_scale_by(_RADIANS_PER_DEGREE))
op(*both("rad2deg"))(_scale_by(_DEGREES_PER_RADIAN))
op(T.deg2rad_, *fns(torch, "deg2rad_"), inplace=True)(_scale_by(_RADIANS_PER_DEGREE))
op(T.rad2deg_, *fns(torch, "rad2deg_"), inplace=True)(_scale_by(_DEGREES_PER_RADIAN))

op(F.sigmoid)(lambda cx, out, x: cx.call("sigmoid", cx.value(x)))
op(F.tanh)(lambda cx, out, x: cx.call("tanh", cx.value(x)))


@op(T.__invert__)
def _invert(cx: CaptureContext, out: Any, x: Any) -> Value:
    v = cx.value(x)
    out_v: Value = cx.call("logical_not" if dtype_of(v) == torch.bool else "bitwise_not", v)
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
    return _maybe_inplace(x, hardtanh_value(cx, cx.value(x), min_val, max_val), inplace)


def hardtanh_value(cx: CaptureContext, v: Value, lo: float, hi: float) -> Value:
    """``hardtanh``: eager's values are ``clamp``'s; its gradient is not: zero at either bound,
    where clamp's passes. Under grad mode (a guarded setting) the clamp's value is taken, and
    detached, outside the open interval: ``where(lo < x < hi, x, detach(clamp(x)))``. NOTE: at
    NaN eager's gradient is zero in its vectorized loop and the cotangent in its scalar tail (it
    depends on the element's position); this is the loop's zero, as clamp's."""
    # NOTE: the bounds are Scalars in ATen's schema: an int stays an int (it rounds once, to
    # x's dtype, where float() would round it to float64 first)
    lo, hi = (b if isinstance(b, int) else float(b) for b in (lo, hi))
    clamped: Value = cx.call("clamp", v, min=lo, max=hi)
    if not torch.is_grad_enabled():
        return clamped
    inside = cx.call("logical_and", cx.call("gt", v, lo), cx.call("lt", v, hi))
    out: Value = cx.call("where", inside, v, cx.call("detach", clamped))
    return out


# --- binary ----------------------------------------------------------------------------------


def _binary(
    ir_op: str,
    funcs: list[Any],
    inplace: list[Any],
    reflected: list[Any] = (),  # type: ignore[assignment]
    alpha: bool = False,
) -> None:
    def emit(cx: CaptureContext, out: Any, a: Any, b: Any, *, alpha: Any = 1) -> Value:
        if ir_op == "pow" and isinstance(out, torch.Tensor) and out.dtype == torch.bool:
            # NOTE: a bool tensor to a bool power, bools as in ATen (the IR's pow is numeric):
            # x ** True is x (x and x), x ** False all True (x or not x)
            x = cx.value(a)
            if b:
                same: Value = cx.call("logical_and", x, x)
                return same
            ones: Value = cx.call("logical_or", x, cx.call("logical_not", x))
            return ones
        attrs = {"alpha": cx.operand(alpha)} if ir_op in ("add", "sub") else {}
        return call_binary(cx, ir_op, a, b, **attrs)

    def emit_reflected(cx: CaptureContext, out: Any, a: Any, b: Any) -> Value:
        return call_binary(cx, ir_op, b, a)

    op(*funcs)(emit)
    op(*inplace, inplace=True)(emit)
    if reflected:
        op(*reflected)(emit_reflected)


_binary("add", [*both("add"), T.__add__, T.__radd__], [T.add_, T.__iadd__])
_binary(
    "sub", [*both("sub", "subtract"), T.__sub__], [T.sub_, T.subtract_, T.__isub__], [T.__rsub__]
)
_binary("mul", [*both("mul", "multiply"), T.__mul__, T.__rmul__], [T.mul_, T.multiply_, T.__imul__])
_binary("pow", [*both("pow"), T.__pow__], [T.pow_, T.__ipow__], [T.__rpow__])
_binary("maximum", both("maximum"), [])
_binary("minimum", both("minimum"), [])
for _ir, _names in {
    "eq": ("eq",),
    "ne": ("ne", "not_equal"),
    "lt": ("lt", "less"),
    "le": ("le", "less_equal"),
    "gt": ("gt", "greater"),
    "ge": ("ge", "greater_equal"),
}.items():
    _binary(_ir, [*both(*_names), getattr(T, f"__{_ir}__")], [])
_binary("logical_and", both("logical_and"), [])
_binary("logical_or", both("logical_or"), [])
_binary("logical_xor", both("logical_xor"), [T.logical_xor_])
_binary("atan2", both("atan2", "arctan2"), [T.atan2_, T.arctan2_])
_binary("hypot", both("hypot"), [T.hypot_])
_binary("copysign", both("copysign"), [T.copysign_])
_binary("fmod", both("fmod"), [T.fmod_])
_binary("remainder", [*both("remainder"), T.__mod__], [T.remainder_, T.__imod__], [T.__rmod__])
_binary("fmax", both("fmax"), [])
_binary("fmin", both("fmin"), [])
_binary("xlogy", [*both("xlogy"), *fns(torch.special, "xlogy")], [T.xlogy_])
for _kind in ("and", "or", "xor"):
    _binary(
        f"bitwise_{_kind}",
        both(f"bitwise_{_kind}"),
        [getattr(T, f"bitwise_{_kind}_"), getattr(T, f"__i{_kind}__")],
    )


@op(torch.rsub)
def _rsub(cx: CaptureContext, out: Any, x: Any, other: Any, alpha: Any = 1) -> Value:
    return call_binary(cx, "sub", other, x, alpha=cx.operand(alpha))


def _div(
    cx: CaptureContext, out: Any, a: Any, b: Any, *, rounding_mode: str | None = None
) -> Value:
    return call_binary(cx, "div", a, b, rounding_mode=rounding_mode)


op(*both("div", "divide", "true_divide"), T.__truediv__, T.__div__)(_div)
op(T.div_, T.divide_, T.true_divide_, T.__itruediv__, inplace=True)(_div)
op(*both("floor_divide"), T.__floordiv__)(
    lambda cx, out, a, b: call_binary(cx, "div", a, b, rounding_mode="floor")
)
op(T.floor_divide_, T.__ifloordiv__, inplace=True)(
    lambda cx, out, a, b: call_binary(cx, "div", a, b, rounding_mode="floor")
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
        return call_binary(cx, f"logical_{kind}", a, b)
    return call_binary(cx, f"bitwise_{kind}", a, b)


# --- select, clamp, casts ----------------------------------------------------------------
@op(*both("where"))
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
    dtype = dtype_of(vx)
    if isinstance(value, T):
        fill: Any = cx.value(value)
        if dtype_of(fill) != dtype:
            fill = cx.call("to_dtype", fill, dtype=dtype)
    else:
        # NOTE: masked_fill converts the scalar to x's dtype first; so do we (a symbolic size
        # stays an expression the kernel converts at each call: ``bool`` of one is always True)
        fill = cx.operand(value)
        if isinstance(fill, sympy.Expr):
            pass
        elif dtype == torch.bool:
            fill = bool(fill)
        elif not dtype.is_floating_point:
            fill = int(fill)
    v: Value = cx.call("where", cx.value(mask), fill, vx)
    if dtype_of(v) != dtype:
        v = cx.call("to_dtype", v, dtype=dtype)
    return v


op(*both("masked_fill"))(_masked_fill)
op(T.masked_fill_, inplace=True)(_masked_fill)


def _clamp(cx: CaptureContext, out: Any, x: Any, min: Any = None, max: Any = None) -> Value:
    v = cx.value(x)
    if (isinstance(min, T) or isinstance(max, T)) and torch.is_grad_enabled():
        return _clamp_tensor_call(cx, v, min, max)
    if isinstance(min, T) or isinstance(max, T):
        for bound, name in ((min, "maximum"), (max, "minimum")):
            if bound is not None:
                v = cx.call(name, v, _bound_tensor(cx, v, bound))
        return v
    out_v: Value = cx.call("clamp", v, min=cx.operand(min), max=cx.operand(max))
    return out_v


def _bound_tensor(cx: CaptureContext, v: Value, bound: Any) -> Value:
    """A clamp bound as a tensor: the bound itself, or a scalar filled in ``v``'s dtype."""
    if isinstance(bound, T):
        return cx.value(bound)
    out: Value = cx.call(
        "full",
        shape=(),
        dtype=dtype_of(v),
        device=str(v.type.device),  # type: ignore[union-attr]
        value=cx.operand(bound),
    )
    return out


def _clamp_tensor_call(cx: CaptureContext, v: Value, lo: Any, hi: Any) -> Value:
    """``clamp`` with a tensor bound under grad mode (a guarded setting): ATen's
    ``clamp.Tensor`` itself, differentiated by PyTorch's autograd. Its gradient is not
    maximum's and minimum's (which split a tie): all of it to ``x`` where ``lo <= x <= hi``, to
    a bound where ``x`` passes it, none at NaN."""
    tensors = [v]
    literals: list[Any] = [{"t": 0}]
    for bound in (lo, hi):
        if bound is None:
            literals.append(None)
            continue
        tensors.append(_bound_tensor(cx, v, bound))
        literals.append({"t": len(tensors) - 1})
    out: Value = cx.call(
        "aten", *tensors, name="clamp", overload="Tensor", literals=json.dumps(literals)
    )
    return out


op(*both("clamp", "clip"))(_clamp)
op(T.clamp_, T.clip_, *fns(torch, "clamp_", "clip_"), inplace=True)(_clamp)
op(*both("clamp_min"))(lambda cx, out, x, m: _clamp(cx, out, x, min=m))
op(*both("clamp_max"))(lambda cx, out, x, m: _clamp(cx, out, x, max=m))
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
    if out.dtype != dtype_of(v):
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
op(*fns(T, *_CASTS))(lambda cx, out, x, *args, **kwargs: _convert(cx, out, x))


def _tri(name: str) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any, diagonal: Any = 0) -> Value:
        v: Value = cx.call(name, cx.value(x), diagonal=cx.int(diagonal))
        return v

    return emit


op(*both("triu"))(_tri("triu"))
op(*both("tril"))(_tri("tril"))
op(T.triu_, inplace=True)(_tri("triu"))
op(T.tril_, inplace=True)(_tri("tril"))


# --- matmul --------------------------------------------------------------------------------
op(*both("matmul", "mm"), T.__matmul__)(lambda cx, out, a, b: call_binary(cx, "matmul", a, b))
op(T.__rmatmul__)(lambda cx, out, a, b: call_binary(cx, "matmul", b, a))
op(*both("bmm"))(lambda cx, out, a, b: call_binary(cx, "bmm", a, b))

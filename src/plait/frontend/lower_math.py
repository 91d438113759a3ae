"""Rules for pointwise math, comparisons, casts, reductions, softmax and matmul.

NOTE: operands keep eager's order and Python scalars stay literals, so the IR's type rules (which
ask ``torch.result_type``) and reference implementations compute exactly what eager does.
"""

from __future__ import annotations

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
}


def _unary(ir_op: str, names: tuple[str, ...]) -> None:
    def emit(cx: CaptureContext, out: Any, x: Any, *_: Any) -> Value:
        v: Value = cx.call(ir_op, cx.value(x))
        return v

    op(*_both(*names))(emit)
    op(*_both(*(n + "_" for n in names)), inplace=True)(emit)


for _ir, _names in _UNARY.items():
    _unary(_ir, _names)

op(F.sigmoid)(lambda cx, out, x: cx.call("sigmoid", cx.value(x)))
op(F.tanh)(lambda cx, out, x: cx.call("tanh", cx.value(x)))


@op(T.__invert__)
def _invert(cx: CaptureContext, out: Any, x: Any) -> Value:
    v = cx.value(x)
    if _dtype_of(v) != torch.bool:
        raise NoIROp("bitwise not of an integer tensor has no IR op")
    out_v: Value = cx.call("logical_not", v)
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


@op(T.__and__, T.__rand__, T.__or__, T.__ror__)
def _bool_logic(cx: CaptureContext, out: Any, a: Any, b: Any) -> Value:
    if out.dtype != torch.bool or not (isinstance(a, T) and isinstance(b, T)):
        raise NoIROp("bitwise and/or of integer tensors, or with a Python scalar, has no IR op")
    name = cx.current.rsplit(".", 1)[-1]
    return _bin(cx, "logical_and" if "and" in name else "logical_or", a, b)


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

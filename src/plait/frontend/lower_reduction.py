"""Rules for reductions (``sum``, ``mean``, ``prod``, ``var``, ``amax``, ``max`` with indices,
``all``/``any``, ``logsumexp``) and softmax.

NOTE: a form the IR's reductions do not compute as eager does (``nansum`` and ``prod`` of 16-bit
floats, which eager accumulates in 16 bits; ``dim=()``) raises
:class:`~plait.frontend.table.NoIROp`: the call then goes the ATen path, never a rule that is
close.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plait.frontend.lower_common import T, both, call_binary, dtype_of, fns
from plait.frontend.table import NoIROp, op
from plait.frontend.tracer import CaptureContext
from plait.ir import TensorType, Value


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


op(*both("sum"))(_reduce("sum"))
op(*both("mean"))(_reduce("mean"))


@op(*both("nansum"))
def _nansum(cx: CaptureContext, out: Any, x: Any, *args: Any, **kwargs: Any) -> Value:
    if out.dtype in (torch.bfloat16, torch.float16) or dtype_of(cx.value(x)) in (
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


op(*both("all"))(_logical_reduce("all"))
op(*both("any"))(_logical_reduce("any"))


@op(*both("count_nonzero"))
def _count_nonzero(cx: CaptureContext, out: Any, x: Any, dim: Any = None) -> Value:
    v: Value = cx.call("count_nonzero", cx.value(x), dims=_dims(cx, dim))
    return v


@op(*both("prod"))
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
    if out.dtype in (torch.bfloat16, torch.float16):
        raise NoIROp("prod of 16-bit floats multiplies in 16 bits in eager")
    v: Value = cx.call("prod", cx.value(x), dims=_dims(cx, dim), keepdim=bool(keepdim), dtype=dtype)
    return v


@op(*both("logsumexp"), *fns(torch.special, "logsumexp"))
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


op(*both("amax"))(_amax("amax"))
op(*both("amin"))(_amax("amin"))


def _max(reduce: str, pointwise: str) -> Any:
    def emit(cx: CaptureContext, out: Any, x: Any, *args: Any, **kwargs: Any) -> Value:
        other = args[0] if args else kwargs.get("other")
        if isinstance(other, T):
            return call_binary(cx, pointwise, x, other)
        if args or kwargs:
            raise NoIROp(
                f"{reduce[1:]}(dim) also returns indices; there is no IR op for arg{reduce[1:]}"
            )
        v: Value = cx.call(reduce, cx.value(x), dims=None, keepdim=False)
        return v

    return emit


op(*both("max"))(_max("amax", "maximum"))
op(*both("min"))(_max("amin", "minimum"))


@op(*both("var"))
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
    xv = cx.value(x)
    t = xv.type
    # NOTE: eager's CPU variance accumulates every float dtype in float64 (ATen's
    # WelfordOps<scalar_t, double>): in float32, the sum of squared deviations of 1000 values of
    # magnitude 1e18 overflowed where eager's variance is 1e36, and the mean of a row of equal
    # values of 1e37 overflowed where eager's variance is 0. CUDA's accumulates in float32.
    wide = isinstance(t, TensorType) and t.device == "cpu" and t.dtype in _WIDENED_VAR
    v: Value = cx.call(
        "var",
        cx.call("to_dtype", xv, dtype=torch.float64) if wide else xv,
        dims=_dims(cx, dim),
        correction=cx.operand(correction),
        keepdim=bool(keepdim),
    )
    if wide:
        assert isinstance(t, TensorType)
        v = cx.call("to_dtype", v, dtype=t.dtype)
    return v


_WIDENED_VAR = (torch.float32, torch.bfloat16, torch.float16)


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


op(F.softmax, *both("softmax"))(_softmax("softmax"))
op(F.log_softmax, *both("log_softmax"))(_softmax("log_softmax"))


@op(*both("cumsum"))
def _cumsum(cx: CaptureContext, out: Any, x: Any, dim: Any, *, dtype: Any = None) -> Value:
    v: Value = cx.call("cumsum", cx.value(x), dim=cx.int(dim), dtype=dtype)
    return v

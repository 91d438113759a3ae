"""Rules for the activations of ``torch.nn.functional`` that have IR ops of their own.

Each keeps eager's arguments as attributes (ELU's family shares one op: ``selu`` and ``celu`` are
``elu`` with ATen's constants) and its ``inplace=True`` form. ``relu6`` is ``clamp(0, 6)``, as
ATen's ``hardtanh``; ``softsign`` and ``tanhshrink`` are written out as their Python definitions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plait.frontend.lower_common import dtype_of, scalar_attr
from plait.frontend.lower_math import hardtanh_value
from plait.frontend.table import InPlace, NoIROp, op
from plait.frontend.tracer import CaptureContext
from plait.ir import TensorType, Value

# NOTE: ATen's selu constants (double literals, as in Activation.cpp).
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _float_value(cx: CaptureContext, x: Any, what: str) -> Value:
    v = cx.value(x)
    assert isinstance(v.type, TensorType)
    if not v.type.dtype.is_floating_point:
        raise NoIROp(f"{what} of a {v.type.dtype} tensor has no IR op")
    return v


def _emit(cx: CaptureContext, x: Any, name: str, inplace: bool, **attrs: Any) -> Any:
    v: Value = cx.call(name, _float_value(cx, x, name), **attrs)
    return InPlace(x, v) if inplace else v


@op(F.leaky_relu)
def _leaky_relu(
    cx: CaptureContext, out: Any, x: Any, negative_slope: float = 0.01, inplace: bool = False
) -> Any:
    return _emit(cx, x, "leaky_relu", inplace, negative_slope=float(negative_slope))


@op(F.hardsigmoid)
def _hardsigmoid(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    return _emit(cx, x, "hardsigmoid", inplace)


@op(F.hardswish)
def _hardswish(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    return _emit(cx, x, "hardswish", inplace)


@op(F.elu)
def _elu(cx: CaptureContext, out: Any, x: Any, alpha: float = 1.0, inplace: bool = False) -> Any:
    return _emit(cx, x, "elu", inplace, alpha=float(alpha))


@op(F.selu, *[f for f in (getattr(torch, "selu", None),) if f is not None])
def _selu(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    return _emit(cx, x, "elu", inplace, alpha=SELU_ALPHA, scale=SELU_SCALE)


@op(F.celu)
def _celu(cx: CaptureContext, out: Any, x: Any, alpha: float = 1.0, inplace: bool = False) -> Any:
    # NOTE: ATen's celu is elu(x, alpha, 1, 1 / alpha), the reciprocal taken in double.
    return _emit(cx, x, "elu", inplace, alpha=float(alpha), input_scale=1.0 / float(alpha))


@op(F.softplus)
def _softplus(
    cx: CaptureContext, out: Any, x: Any, beta: float = 1.0, threshold: float = 20.0
) -> Any:
    return _emit(cx, x, "softplus", False, beta=float(beta), threshold=float(threshold))


@op(F.mish)
def _mish(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    return _emit(cx, x, "mish", inplace)


@op(F.logsigmoid)
def _logsigmoid(cx: CaptureContext, out: Any, x: Any) -> Any:
    return _emit(cx, x, "logsigmoid", False)


@op(F.hardshrink, torch.Tensor.hardshrink)
def _hardshrink(cx: CaptureContext, out: Any, x: Any, lambd: float = 0.5) -> Any:
    return _emit(cx, x, "hardshrink", False, lambd=float(lambd))


@op(F.softshrink)
def _softshrink(cx: CaptureContext, out: Any, x: Any, lambd: float = 0.5) -> Any:
    return _emit(cx, x, "softshrink", False, lambd=float(lambd))


@op(F.threshold)
def _threshold(
    cx: CaptureContext, out: Any, x: Any, threshold: float, value: float, inplace: bool = False
) -> Any:
    # NOTE: both are Scalars in ATen's schema: an int rounds once, to x's dtype
    dtype = dtype_of(cx.value(x))
    attrs = {"threshold": scalar_attr(threshold, dtype), "value": scalar_attr(value, dtype)}
    return _emit(cx, x, "threshold", inplace, **attrs)


@op(F.relu6)
def _relu6(cx: CaptureContext, out: Any, x: Any, inplace: bool = False) -> Any:
    v = hardtanh_value(cx, cx.value(x), 0.0, 6.0)
    return InPlace(x, v) if inplace else v


@op(F.softsign)
def _softsign(cx: CaptureContext, out: Any, x: Any) -> Value:
    v = cx.value(x)  # NOTE: F.softsign is ``input / (input.abs() + 1)``
    out_v: Value = cx.call("div", v, cx.call("add", cx.call("abs", v), 1))
    return out_v


@op(F.tanhshrink)
def _tanhshrink(cx: CaptureContext, out: Any, x: Any) -> Value:
    v = cx.value(x)  # NOTE: F.tanhshrink is ``input - input.tanh()``
    out_v: Value = cx.call("sub", v, cx.call("tanh", v))
    return out_v

"""What runs libdevice's functions when Triton interprets kernels on the CPU (CI, tests).

libdevice is CUDA bitcode and does not run in Triton's interpreter, so the loader binds a printed
kernel's ``M`` to this module there (:mod:`plait.codegen.triton_load`). Each function takes the
interpreter's ``tl.tensor`` values and returns one computed by numpy, in the first argument's
dtype (float32 arguments are computed in float64 and rounded once). Exact functions (floor, trunc,
rint, fmod, copysign, signbit, division, square root) give libdevice's results bitwise; the
transcendentals may differ from libdevice's by an ulp or so. Infinities and NaNs are legitimate
results: numpy's floating-point warnings are silenced.

Triton is imported on first use, so importing this module needs no Triton.

Example:
    >>> sorted(FUNCTIONS)[:4]
    ['acos', 'acosh', 'asin', 'asinh']
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])

_UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": np.exp,
    "log": np.log,
    "sqrt_rn": np.sqrt,
    "tanh": np.tanh,
    "erf": _erf,
    "erfc": _erfc,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "expm1": np.expm1,
    "log1p": np.log1p,
    "log2": np.log2,
    "log10": np.log10,
    "exp2": np.exp2,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "rint": np.rint,
}
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "atan2": np.arctan2,
    "hypot": np.hypot,
    "pow": np.power,
    "fmod": np.fmod,
    "copysign": np.copysign,
    "div_rn": np.divide,
}


def _tensor(data: Any, element: Any, *args: Any) -> Any:
    """An interpreter tensor holding ``data`` (of element type ``element``), shaped as the
    broadcast of ``args``."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    blocks = [a.type for a in args if a.type.is_block()]
    if blocks:
        ty: Any = tl.block_type(element, list(np.shape(data)))
    else:
        ty = element
    return tl.tensor(TensorHandle(data, element), ty)


def _apply(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` of the arguments' data, in float64, rounded to the first argument's dtype."""
    data = [a.handle.data for a in args]
    dtype = data[0].dtype
    with np.errstate(all="ignore"):
        out = fn(*(d.astype(np.float64) for d in data))
        out = np.asarray(out).astype(dtype)
    return _tensor(out, args[0].handle.dtype.scalar, *args)


def _unary(name: str) -> Callable[[Any], Any]:
    fn = _UNARY[name]

    def call(x: Any) -> Any:
        return _apply(fn, x)

    call.__name__ = name
    return call


def _binary(name: str) -> Callable[[Any, Any], Any]:
    fn = _BINARY[name]

    def call(x: Any, y: Any) -> Any:
        return _apply(fn, x, y)

    call.__name__ = name
    return call


def signbit(x: Any) -> Any:
    """libdevice's signbit: a nonzero int32 where the sign bit is set (NaNs included)."""
    import triton.language as tl

    return _tensor(np.signbit(x.handle.data).astype(np.int32), tl.int32, x)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{name: _unary(name) for name in _UNARY},
    **{name: _binary(name) for name in _BINARY},
    "signbit": signbit,
}
# NOTE: module globals, so a kernel calls them as libdevice's: ``M.exp(x)``.
globals().update(FUNCTIONS)

"""What the ``lower_*`` rule modules share: the callables one name spells (``torch.add`` and
``Tensor.add``), an IR value's dtype and the IR call of a binary op on two operands.
"""

from __future__ import annotations

from typing import Any

import torch

from plait.frontend.tracer import CaptureContext
from plait.ir import TensorType, Value

T = torch.Tensor


def fns(owner: Any, *names: str) -> list[Any]:
    """The attributes ``names`` of ``owner`` that exist (a torch build may lack some)."""
    return [getattr(owner, n) for n in names if hasattr(owner, n)]


def both(*names: str) -> list[Any]:
    """The ``torch.`` function and the ``Tensor`` method of each name, where they exist."""
    return fns(torch, *names) + fns(T, *names)


def dtype_of(v: Value) -> torch.dtype:
    assert isinstance(v.type, TensorType)
    return v.type.dtype


def scalar_attr(value: Any, dtype: torch.dtype) -> float:
    """A float attribute for a ``Scalar`` argument, as eager converts it to ``dtype``: an int
    rounds once, straight to a float ``dtype`` (``float(int)`` would round it to float64 first,
    a second rounding for float32 past 2**53).

    >>> scalar_attr(2**60 + 2**36 + 1, torch.float32) == 2.0**60 + 2**37
    True
    """
    if isinstance(value, int) and not isinstance(value, bool) and dtype.is_floating_point:
        return float(torch.tensor(value).to(dtype))
    return float(value)


def call_binary(cx: CaptureContext, ir_op: str, a: Any, b: Any, **attrs: Any) -> Value:
    """IR op ``ir_op`` of ``a`` and ``b`` in eager's order (a Python scalar stays a literal)."""
    v: Value = cx.call(ir_op, cx.operand(a), cx.operand(b), **attrs)
    return v

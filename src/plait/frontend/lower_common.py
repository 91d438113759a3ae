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


def call_binary(cx: CaptureContext, ir_op: str, a: Any, b: Any, **attrs: Any) -> Value:
    """IR op ``ir_op`` of ``a`` and ``b`` in eager's order (a Python scalar stays a literal)."""
    v: Value = cx.call(ir_op, cx.operand(a), cx.operand(b), **attrs)
    return v

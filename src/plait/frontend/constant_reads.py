"""A read of tensor data whose tensors the graph computes from no input: a constant of the
specialization, read as that value instead of refusing the program."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sympy
import torch

from plait.frontend.capture_values import Tracer
from plait.ir import TensorType, Value
from plait.ir.ops import get_op

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

NOT_CONSTANT = object()


def constant_read(cx: CaptureContext, func: Any, args: tuple, kwargs: dict) -> Any:
    """A read of tensor data whose tensors the graph computes from no input (only from
    constant factories such as ``arange`` of static sizes, through deterministic ops): the
    value is the same on every call of this specialization, so the read is that value (a
    Python value; a tensor result is not folded). Else ``NOT_CONSTANT``. Tensors computed
    from symbolic sizes alone (``arange(x.shape[-1])``) restart the capture with those
    sizes static, where the read is such a constant."""
    from plait.frontend.tracer import pytree_leaves

    found: list[Tracer] = []
    cx.unwrap((args, kwargs), found)
    syms: set[sympy.Symbol] = set()
    for t in found:
        used = _sizes_only(cx.value(t))
        if used is None:
            return NOT_CONSTANT
        syms |= used
    if not found:
        return NOT_CONSTANT
    if syms:
        bound = syms & set(cx.bindings)
        if bound:
            cx.restart(bound, f"{cx.current} reads a tensor computed from these sizes")
        return NOT_CONSTANT
    out, _ = cx.sample(func, args, kwargs)
    if any(isinstance(x, torch.Tensor) for x in pytree_leaves(out)):
        return NOT_CONSTANT
    return out


def _sizes_only(value: Value) -> set[sympy.Symbol] | None:
    """The size symbols ``value`` is computed from when it is computed from no graph input and
    no random op (its types, operands and attributes may be symbolic); else None. An empty set:
    from constants of this specialization alone."""
    stack, seen, syms = [value], set(), set()
    while stack:
        v = stack.pop()
        if v.kind is not None or not isinstance(v.type, TensorType):
            return None
        syms |= {s for d in v.type.shape if isinstance(d, sympy.Basic) for s in d.free_symbols}
        node = v.producer
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        if get_op(node.op).is_random(node.attrs):
            return None
        for operand in (*node.inputs, *node.attrs.values()):
            if isinstance(operand, Value):
                stack.append(operand)
            elif isinstance(operand, sympy.Basic):
                syms |= operand.free_symbols
    return syms

"""Calls whose aliasing eager decides by the operand's strides.

``reshape`` (``flatten``, ``ravel``, ``reshape_as``) returns a view where the operand's strides
allow one and a copy elsewhere; ``contiguous()`` returns the operand itself where it is
contiguous and a copy elsewhere; ``view`` (``view_as``) raises where no view exists. Capture
makes the choice eager makes for the sample, and the IR has value semantics; so the choice holds
for another call only while the strides it was made on are kept. The strides of the tensors the
program reads are guarded (the capture context's ``layout_read``) where the choice shows:

- a ``view`` that could fail for other strides, at once;
- a ``reshape``/``contiguous`` whose result or operand is written afterwards (the write reaches
  the other one or not), or whose result is returned while its operand is an input, a parameter,
  a buffer or a constant (the result is that tensor's memory or not): the roots of both are
  marked here, and the write (``CaptureValues.assign``) or the output reads the mark.

A choice that no strides change is not guarded: a reshape that only splits dims or moves dims of
size 1 (always a view), ``contiguous()`` of a tensor with at most one dim larger than 1 (always
itself), and either of them, or ``view``, of the result of ``contiguous()`` (always row-major).

Example:
    >>> merges((4, 6), (24,)), merges((4, 6), (2, 2, 6)), merges((1, 8, 1), (8,))
    (True, False, False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sympy

from plait.ir import TensorType, Value
from plait.symbolic import known_equal

if TYPE_CHECKING:
    from plait.frontend.capture_values import Tracer
    from plait.frontend.tracer import CaptureContext


def merges(src: Sequence[Any], dst: Sequence[Any]) -> bool:
    """Whether reshaping ``src`` into ``dst`` merges dims larger than 1 (a view only for some
    strides); False where each dim of ``dst`` larger than 1 lies within one dim of ``src``.
    NOTE: a symbolic dim counts as larger than 1, and a product not proven equal as a merge."""
    a = [d for d in src if not _is_one(d)]
    b = [d for d in dst if not _is_one(d)]
    j = 0
    for d in a:
        prod: Any = 1
        while not known_equal(prod, d):
            if j == len(b) or (_known(prod) and _known(d) and int(prod) > int(d)):
                return True
            prod = prod * b[j]
            j += 1
    return j != len(b)


def _is_one(d: Any) -> bool:
    return isinstance(d, int) and d == 1


def _known(d: Any) -> bool:
    return isinstance(d, (int, sympy.Integer))


def _fixed_layout(v: Value) -> bool:
    """``v`` is the result of ``contiguous()``: row-major whatever the strides of the inputs."""
    return v.producer is not None and v.producer.op == "contiguous"


def depends_on_strides(cx: CaptureContext, x: Any, op: str, result: Value) -> bool:
    """Whether eager's choice for ``op`` (``"reshape"``, ``"view"`` or ``"contiguous"``) of ``x``
    into ``result`` may differ for other strides of ``x``."""
    v = cx.value(x)
    if _fixed_layout(v):
        return False
    assert isinstance(v.type, TensorType) and isinstance(result.type, TensorType)
    if op == "contiguous":
        return sum(not _is_one(d) for d in v.type.shape) > 1
    return merges(v.type.shape, result.type.shape)


def guard_view(cx: CaptureContext, x: Any, result: Value) -> None:
    """A ``view`` of ``x`` into ``result``: eager refuses it for some strides, so where it may,
    the strides the program reads are guarded (see the module doc)."""
    if cx.layout_read is None and depends_on_strides(cx, x, "view", result):
        cx.layout_read = f"{cx.current} (a view that other strides refuse)"


def mark(cx: CaptureContext, source: Tracer, result: Tracer) -> None:
    """``result`` is a view or a copy of ``source`` by its strides: a later write to either, or
    returning ``result`` where ``source`` is a lifted tensor, guards the strides."""
    note = f"{cx.current} (a view or a copy by the strides)"
    src_root = source._root if source._root is not None else source
    res_root = result._root if result._root is not None else result
    for root in (src_root, res_root):
        if root._stride_choice is None:
            root._stride_choice = note
    if src_root._lift is not None and res_root._stride_output is None:
        res_root._stride_output = note


def on_write(cx: CaptureContext, root: Tracer) -> None:
    """``root`` is written in place: guard the strides if its aliasing was a stride choice."""
    if cx.layout_read is None and root._stride_choice is not None:
        cx.layout_read = root._stride_choice


def on_output(cx: CaptureContext, tracer: Tracer) -> None:
    """``tracer`` is returned: guard the strides if whether it is an input's memory was a
    stride choice."""
    root = tracer._root if tracer._root is not None else tracer
    note = root._stride_output or (root._stride_choice if root._lift is not None else None)
    if cx.layout_read is None and note is not None:
        cx.layout_read = note

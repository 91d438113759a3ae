"""The rule for ``F.cross_entropy`` with class-index targets in a capture with symbolic dims
(``dynamic=True``, or automatic dynamic's second capture): ``log_softmax`` over the classes,
the target's log-probability picked by a gather, negated, ignored targets masked to zero, then
the reduction (``mean``: the sum over the targets not ignored, divided by their count, as
eager's ``nll_loss``).

A static capture keeps ATen's program (``log_softmax`` and ``nll_loss`` as eager's kernels,
the path every static capture took before this rule): the rule raises ``NoIROp`` there and the
capture traces the call to ATen. A dynamic capture traces nothing to ATen (even a call whose
operands are static there), so without this rule its loss ran the whole program eagerly.

Not lowered (``NoIROp``; an opaque node or ATen's program where shapes allow it): class weights,
label smoothing, probabilities as targets, the legacy ``size_average``/``reduce`` arguments, an
unbatched input, a symbolic class dim (or trailing dim: the gather needs their strides; a
classifier's class count is its last layer's, static, and automatic dynamic makes only the
dims that changed symbolic). A target out of range (and not ``ignore_index``) raises at the
call, as eager's does: the gather refuses a position outside the classes.

Example:
    >>> import torch, torch.nn.functional as F, plait
    >>> head = torch.nn.Linear(8, 4)
    >>> loss = plait.compile(lambda x, t: F.cross_entropy(head(x), t), dynamic=True)
    >>> x, t = torch.randn(5, 8), torch.tensor([0, 3, -100, 1, 2])
    >>> torch.allclose(loss(x, t), F.cross_entropy(head(x), t))
    True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plait.frontend.lower_movement import _gather_value
from plait.frontend.lower_shape import _type
from plait.frontend.table import NoIROp, op
from plait.frontend.tracer import CaptureContext
from plait.ir import Value


@op(F.cross_entropy)
def _cross_entropy(
    cx: CaptureContext,
    out: Any,
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: Any = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Value:
    if not cx.dynamic:
        raise NoIROp("a static capture: ATen's log_softmax and nll_loss")
    x = cx.value(input)
    xt = _type(x)
    if weight is not None or size_average is not None or reduce is not None:
        raise NoIROp("class weights or the legacy size_average/reduce arguments")
    if label_smoothing:
        raise NoIROp("label smoothing")
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise NoIROp("class probabilities as targets")
    if xt.rank < 2 or reduction not in ("mean", "sum", "none"):
        raise NoIROp("an unbatched input or an unknown reduction")
    if not all(isinstance(n, int) for n in xt.shape[1:]):
        # NOTE: the gather takes the classes' stride and bounds from static dims
        raise NoIROp("a symbolic class dim or trailing dim")
    t = cx.value(target)
    if target.dtype != torch.int64:
        # NOTE: ATen compares a Byte target with ignore_index as int64; in uint8, ``t != -100``
        # would wrap -100 to 156 and ignore class 156
        t = cx.call("to_dtype", t, dtype=torch.int64)
    valid = cx.call("ne", t, cx.int(ignore_index))
    picked = _gather_value(
        cx,
        cx.call("log_softmax", x, dim=1, dtype=None),
        1,
        cx.call("unsqueeze", cx.call("where", valid, t, 0), dim=1),
        wrap=False,
    )
    loss = cx.call("where", valid, cx.call("neg", cx.call("squeeze", picked, dims=(1,))), 0.0)
    if reduction == "none":
        return loss
    every = tuple(range(_type(loss).rank))
    total: Value = cx.call("sum", loss, dims=every, keepdim=False, dtype=None)
    if reduction == "sum":
        return total
    count = cx.call("sum", cx.call("to_dtype", valid, dtype=xt.dtype), dims=every, keepdim=False,
                    dtype=None)  # fmt: skip
    mean: Value = cx.call("div", total, count)
    return mean

"""The rule for ``F.cross_entropy`` with class-index targets in a capture with symbolic dims
(``dynamic=True``, or automatic dynamic's second capture): ``log_softmax`` over the classes,
the target's log-probability picked by a gather, negated (times the target's class weight),
ignored targets masked to zero, then the reduction (``mean``: the sum over the targets not
ignored, divided by their count or the sum of their class weights, as eager's ``nll_loss``);
with label smoothing, ATen's mix of that loss and the negated sum of the (weighted)
log-probabilities over the classes, masked and reduced alike.

A static capture keeps ATen's program (``log_softmax`` and ``nll_loss`` as eager's kernels,
the path every static capture took before this rule): the rule raises ``NoIROp`` there and the
capture traces the call to ATen. A dynamic capture traces nothing to ATen (even a call whose
operands are static there), so without this rule its loss ran the whole program eagerly.

Not lowered (``NoIROp``; an opaque node or ATen's program where shapes allow it): class weights
that require grad (eager refuses them), probabilities as targets, the legacy
``size_average``/``reduce`` arguments, an unbatched input, a symbolic class dim (or trailing
dim: the gather needs their strides; a classifier's class count is its last layer's, static,
and automatic dynamic makes only the dims that changed symbolic). A target out of range (and
not ``ignore_index``) raises at the call, as eager's does: the gather refuses a position
outside the classes.

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
    if size_average is not None or reduce is not None:
        raise NoIROp("the legacy size_average/reduce arguments")
    if weight is not None and (not isinstance(weight, torch.Tensor) or weight.requires_grad):
        raise NoIROp("class weights that require grad (eager's nll_loss refuses them)")
    if not isinstance(label_smoothing, (int, float)):
        raise NoIROp("a label smoothing that is not a number")
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        raise NoIROp("class probabilities as targets")
    if xt.rank < 2 or reduction not in ("mean", "sum", "none"):
        raise NoIROp("an unbatched input or an unknown reduction")
    if not all(isinstance(n, int) for n in xt.shape[1:]):
        # NOTE: the gather takes the classes' stride and bounds from static dims
        raise NoIROp("a symbolic class dim or trailing dim")
    classes = xt.shape[1]
    t = cx.value(target)
    if target.dtype != torch.int64:
        # NOTE: ATen compares a Byte target with ignore_index as int64; in uint8, ``t != -100``
        # would wrap -100 to 156 and ignore class 156
        t = cx.call("to_dtype", t, dtype=torch.int64)
    valid = cx.call("ne", t, cx.int(ignore_index))
    safe = cx.call("where", valid, t, 0)
    logp = cx.call("log_softmax", x, dim=1, dtype=None)
    picked = _gather_value(cx, logp, 1, cx.call("unsqueeze", safe, dim=1), wrap=False)
    nll = cx.call("neg", cx.call("squeeze", picked, dims=(1,)))
    w = cx.value(weight) if weight is not None else None
    # NOTE: the mean divides by the targets' weights (1 each without class weights), as ATen
    counted = cx.call("to_dtype", valid, dtype=xt.dtype)
    if w is not None:
        tt = _type(t)
        wt = cx.call("index_select", w, cx.call("reshape", safe, shape=(-1,)), dim=0)
        wt = cx.call("reshape", wt, shape=tt.shape)
        nll = cx.call("mul", nll, wt)
        counted = cx.call("where", valid, wt, 0.0)
    every = tuple(range(_type(nll).rank))
    loss = _reduced(cx, cx.call("where", valid, nll, 0.0), counted, every, reduction)
    if not label_smoothing:
        return loss
    # NOTE: ATen's cross_entropy_loss_label_smoothing: the nll loss, then the negated sum of
    # the (weighted) log-probabilities over the classes, masked and reduced alike
    if w is not None:
        spread = (1, classes, *([1] * (xt.rank - 2)))
        logp = cx.call("mul", logp, cx.call("reshape", w, shape=spread))
    smooth = cx.call("neg", cx.call("sum", logp, dims=(1,), keepdim=False, dtype=None))
    smooth = _reduced(cx, cx.call("where", valid, smooth, 0.0), counted, every, reduction)
    mixed: Value = cx.call(
        "add",
        cx.call("mul", loss, 1 - label_smoothing),
        cx.call("mul", smooth, label_smoothing / classes),
    )
    return mixed


def _reduced(
    cx: CaptureContext, loss: Value, counted: Value, every: tuple[int, ...], reduction: str
) -> Value:
    """``loss`` reduced: as is, summed, or summed and divided by the sum of ``counted``."""
    if reduction == "none":
        return loss
    total: Value = cx.call("sum", loss, dims=every, keepdim=False, dtype=None)
    if reduction == "sum":
        return total
    count = cx.call("sum", counted, dims=every, keepdim=False, dtype=None)
    mean: Value = cx.call("div", total, count)
    return mean

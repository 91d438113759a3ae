"""Capture rules for PyTorch's composite statistics calls: ``cov``, ``corrcoef`` and
``combinations``, written with the ops ATen itself reduces them to.

ATen's ``cov`` checks ``norm_factor <= 0`` on a tensor (a data read that makes its ATen graph
untraceable); without weights the factor is ``observations - correction``, known at capture, so
the rule needs no read: the sum over observations divided by their count, the centred rows, one
``mm`` with their transpose, divided by the factor, squeezed. A factor <= 0 (eager warns and
divides by zero), weights, and non-float inputs raise :class:`~plait.frontend.table.NoIROp`.
``combinations`` selects with a constant index that lists the index tuples in ATen's order
(the ``masked_select`` of an upper-triangular mask over a meshgrid, i.e. lexicographic).

Example:
    >>> import torch, plait
    >>> f = plait.compile(torch.cov, backend="eager")
    >>> x = torch.randn(3, 6)
    >>> torch.allclose(f(x), torch.cov(x), atol=1e-6)
    True
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from plait.frontend.table import NoIROp, op
from plait.frontend.tracer import CaptureContext
from plait.ir import TensorType, Value

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _static_type(cx: CaptureContext, t: Any, what: str) -> TensorType:
    ty = cx.value(t).type
    if not isinstance(ty, TensorType) or not all(isinstance(d, int) for d in ty.shape):
        raise NoIROp(f"{what} of a tensor with symbolic sizes has no IR op")
    return ty


def _cov(cx: CaptureContext, x: Any, correction: Any) -> Value:
    ty = _static_type(cx, x, "cov")
    if ty.dtype not in FLOATS or ty.rank > 2 or not isinstance(correction, int):
        raise NoIROp("cov of a non-float tensor, of rank > 2, or with a non-int correction")
    v = cx.value(x)
    if ty.rank < 2:
        v = cx.call("reshape", v, shape=(1, -1))
    observations = int(ty.shape[-1]) if ty.rank else 1
    factor = observations - correction
    if factor <= 0:
        raise NoIROp("cov with degrees of freedom <= 0 (eager warns and divides by zero)")
    total = cx.call("sum", v, dims=(1,), keepdim=False, dtype=None)
    mean = cx.call("div", total, observations, rounding_mode=None)
    centred = cx.call("sub", v, cx.call("unsqueeze", mean, dim=1), alpha=1)
    product = cx.call("matmul", centred, cx.call("transpose", centred, dim0=0, dim1=1))
    scaled = cx.call("div", product, factor, rounding_mode=None)
    out: Value = cx.call("squeeze", scaled, dims=None)
    return out


@op(torch.cov, torch.Tensor.cov)
def _cov_rule(
    cx: CaptureContext,
    out: Any,
    x: Any,
    *,
    correction: Any = 1,
    fweights: Any = None,
    aweights: Any = None,
) -> Value:
    if fweights is not None or aweights is not None:
        raise NoIROp("cov with frequency or observation weights has no IR op")
    return _cov(cx, x, correction)


@op(torch.corrcoef, torch.Tensor.corrcoef)
def _corrcoef(cx: CaptureContext, out: Any, x: Any) -> Value:
    """``cov / sqrt(diag)`` over rows, then columns, clipped to [-1, 1]; a 0-d covariance is
    ``c / c`` (NaN for 0, inf or NaN, else 1), as ATen."""
    c = _cov(cx, x, 1)
    assert isinstance(c.type, TensorType)
    if c.type.rank == 0:
        same: Value = cx.call("div", c, c, rounding_mode=None)
        return same
    std = cx.call("sqrt", cx.call("diagonal", c, offset=0, dim1=0, dim2=1))
    c = cx.call("div", c, cx.call("unsqueeze", std, dim=1), rounding_mode=None)
    c = cx.call("div", c, cx.call("unsqueeze", std, dim=0), rounding_mode=None)
    clipped: Value = cx.call("clamp", c, min=-1, max=1)
    return clipped


@op(torch.combinations)
def _combinations(
    cx: CaptureContext, out: Any, x: Any, r: Any = 2, with_replacement: Any = False
) -> Value:
    ty = _static_type(cx, x, "combinations")
    r = cx.int(r)
    if ty.rank != 1 or r < 1:
        raise NoIROp("combinations of a tensor that is not a vector, or with r < 1")
    choose = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = list(choose(range(int(ty.shape[0])), r))
    index = torch.tensor(rows, dtype=torch.int64).reshape(-1)
    picked = cx.call("index_select", cx.value(x), cx.value(cx.lift_const(index)), dim=0)
    shaped: Value = cx.call("reshape", picked, shape=(len(rows), r))
    return shaped

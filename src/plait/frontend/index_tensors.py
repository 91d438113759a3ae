"""Indexing adjacent dims with several integer tensors at once (``mask[batch_idx, kv_idx]``,
as transformers' mask functions do): one ``index_select`` of the dims flattened, at an offset
combined from the indices, each checked against its own dim first.

Example:
    >>> import torch, plait
    >>> f = plait.compile(lambda x, i, j: x[i, j] * 2)
    >>> x, i, j = torch.randn(3, 4, 5), torch.tensor([[0], [2]]), torch.tensor([1, -1, 3])
    >>> bool(torch.equal(f(x, i, j), x[i, j] * 2))
    True
"""

from __future__ import annotations

from typing import Any

import torch

from plait.frontend.table import NoIROp
from plait.frontend.tracer import CaptureContext
from plait.ir import TensorType, Value


def _type(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType)
    return v.type


def count(index: Any) -> int:
    return len(index) if isinstance(index, list) else 1


def listed(index: Any) -> list[Any]:
    return index if isinstance(index, list) else [index]


def _checked(cx: CaptureContext, idx: Value, n: int, device: Any) -> Value:
    """``idx`` with negative entries wrapped, read through ``index_select`` of ``arange(n)``:
    the same values, and eager's IndexError for an entry out of ``[-n, n)``."""
    if _type(idx).dtype != torch.int64:
        idx = cx.call("to_dtype", idx, dtype=torch.int64)
    wrapped = cx.call("where", cx.call("lt", idx, 0), cx.call("add", idx, n), idx)
    iota = cx.call("arange", start=0, end=n, step=1, dtype=torch.int64, device=device)
    flat = cx.call("reshape", wrapped, shape=(-1,))
    checked = cx.call("index_select", iota, flat, dim=0)
    out: Value = cx.call("reshape", checked, shape=tuple(_type(idx).shape))
    return out


def gather_adjacent(cx: CaptureContext, v: Value, dim: int, indices: list[Any]) -> Value:
    """``v[..., i, j, ...]`` with integer tensors indexing the adjacent dims from ``dim`` on:
    each bounds-checked on its own dim (a row-major offset alone would let an entry past one
    dim reach into the next), combined into one offset into those dims flattened, picked by
    ``index_select`` and shaped as eager's (the broadcast indices' shape in their place)."""
    ty = _type(v)
    sizes = ty.shape[dim : dim + len(indices)]
    if not all(isinstance(n, int) for n in sizes):
        raise NoIROp("index tensors on a symbolic dim have no IR op")  # NOTE: an opaque node
    offset: Value | None = None
    for idx, n in zip(indices, sizes):
        checked = _checked(cx, cx.value(idx), int(n), ty.device)
        offset = checked if offset is None else cx.call("add", cx.call("mul", offset, n), checked)
    assert offset is not None
    joint = tuple(_type(offset).shape)
    rows = cx.call("reshape", v, shape=(*ty.shape[:dim], -1, *ty.shape[dim + len(indices) :]))
    picked = cx.call("index_select", rows, cx.call("reshape", offset, shape=(-1,)), dim=dim)
    shape = (*ty.shape[:dim], *joint, *ty.shape[dim + len(indices) :])
    out: Value = cx.call("reshape", picked, shape=shape)
    return out

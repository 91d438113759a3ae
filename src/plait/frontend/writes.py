"""Which arguments a torch call writes in place, decided *before* the call runs.

NOTE: parameters are traced through their own memory (cloning every weight would double the
model's memory during capture), so a write to one must be refused before PyTorch performs it.
The frontend also checks the parameters' version counters after capture as a last line.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from plait.frontend.views import storage_id

_NOT_INPLACE = {"__index__", "__int__", "__invert__", "__iter__", "__init__"}
_INPLACE_ARG: dict[Any, int | None] = {}


def inplace_index(func: Any) -> int | None:
    """Position of an ``inplace`` parameter in ``func``'s signature (cached), else None."""
    try:
        return _INPLACE_ARG[func]
    except (KeyError, TypeError):
        pass
    index: int | None = None
    try:
        params = list(inspect.signature(func).parameters)
        index = params.index("inplace") if "inplace" in params else None
    except (TypeError, ValueError):
        index = None
    with contextlib.suppress(TypeError):  # an unhashable callable is simply not cached
        _INPLACE_ARG[func] = index
    return index


def write_targets(name: str, func: Any, args: tuple, kwargs: dict) -> list[Any]:
    """The tensors ``func(*args, **kwargs)`` (named ``name``) may write in place."""
    last = name.rsplit(".", 1)[-1]
    dunder = last.startswith("__") and last.endswith("__")
    if (
        (last.endswith("_") and not dunder)
        or last == "__setitem__"
        or (dunder and last.startswith("__i") and last not in _NOT_INPLACE)
    ):
        return list(args[:1])
    if last == "batch_norm":
        if name.startswith("nn.functional"):
            return [
                a
                for a in (*args[1:3], kwargs.get("running_mean"), kwargs.get("running_var"))
                if a is not None
            ]
        return [a for a in args[3:5] if a is not None]
    index = inplace_index(func)
    if index is not None:
        flag = kwargs.get("inplace", args[index] if len(args) > index else False)
        if flag:
            return list(args[:1])
    return []


_EXACT_LIMIT = 1 << 22  # NOTE: elements; larger views are compared by their address ranges


def partial_overlap(written: torch.Tensor, read: torch.Tensor) -> bool:
    """Whether ``read``, an operand of a call that writes ``written`` in place, shares memory
    with it other than element for element (``x[:, 1:].add_(x[:, :-1])``, ``x.add_(x[0])``):
    eager's loop then reads elements the same call already wrote, in its order of visits,
    which a captured graph (all reads before the write) does not reproduce. Exact up to
    ``_EXACT_LIMIT`` elements each; beyond it, intersecting address ranges count as overlap.

    Example:
        >>> x = torch.zeros(3, 5)
        >>> partial_overlap(x[:, 1:], x[:, :-1]), partial_overlap(x, x.view(3, 5))
        (True, False)
        >>> partial_overlap(x[:, ::2], x[:, 1::2])
        False
    """
    if written.numel() == 0 or read.numel() == 0 or storage_id(written) != storage_id(read):
        return False
    same_view = (
        written.storage_offset() == read.storage_offset()
        and written.shape == read.shape
        and written.stride() == read.stride()
        and written.dtype == read.dtype
    )
    if same_view:
        return False
    w_lo, w_hi = _byte_range(written)
    r_lo, r_hi = _byte_range(read)
    if w_hi <= r_lo or r_hi <= w_lo:
        return False
    size = written.element_size()
    if (
        max(written.numel(), read.numel()) > _EXACT_LIMIT
        or read.element_size() != size
        or (w_lo - r_lo) % size
    ):
        return True  # NOTE: elements that straddle each other: overlap, conservatively
    return bool(torch.isin(_starts(written), _starts(read)).any())


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    size = t.element_size()
    lo = int(t.storage_offset()) * size
    span = sum((int(n) - 1) * int(st) for n, st in zip(t.shape, t.stride()) if n > 0)
    return lo, lo + span * size + size


def _starts(t: torch.Tensor) -> torch.Tensor:
    """The storage offset of every element of ``t``."""
    offsets = torch.full((1,), int(t.storage_offset()), dtype=torch.int64)
    for n, st in zip(t.shape, t.stride()):
        steps = torch.arange(int(n), dtype=torch.int64) * int(st)
        offsets = (offsets.unsqueeze(-1) + steps).flatten()
    return offsets

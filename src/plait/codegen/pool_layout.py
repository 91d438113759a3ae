"""Max pooling of a row-major (NCHW) CPU tensor through a channels_last copy of it.

PyTorch's CPU max-pool kernel for a row-major input walks one plane at a time without vector
lanes; its channels_last kernel takes the channels in lanes. On the 2-core AMD EPYC development
VM, the channels_last copy, its pool and the copy back of its results to row-major took a
quarter of the row-major call: ResNet-18's training max pool (``[8, 64, 56, 56]``, 3x3, stride
2) 9.6 ms against 2.2 ms at one thread, 5.0 against 1.0 at two. Few channels or few elements
gain nothing (``[1, 3, 224, 224]`` took longer), so only inputs of at least
:data:`MIN_CHANNELS` channels and :data:`MIN_NUMEL` elements take that route.

NOTE: invariant: both kernels scan each window in the same order and keep the first maximum (a
NaN wins), so values and indices are bitwise eager's; the results come back row-major, the
layout the plan recorded for the row-major call. bfloat16 keeps the direct call: its
channels_last kernel returns a NaN maximum as 0xFFFF where the row-major one gives 0x7FC0.

Example:
    >>> import torch
    >>> x = torch.randn(2, 16, 64, 64)
    >>> pool = channels_last_pool(torch.ops.aten.max_pool2d_with_indices)
    >>> y, i = pool(x, [3, 3], [2, 2], [1, 1])
    >>> ref = torch.ops.aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])
    >>> torch.equal(y, ref[0]) and torch.equal(i, ref[1]) and y.is_contiguous()
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

MIN_CHANNELS = 8
MIN_NUMEL = 1 << 16
DTYPES = (torch.float32, torch.float64)


def by_channels_last(x: Any) -> bool:
    """Whether a max pool of ``x`` runs through its channels_last copy."""
    return (
        isinstance(x, torch.Tensor)
        and x.device.type == "cpu"
        and x.dim() == 4
        and x.dtype in DTYPES
        and x.shape[1] >= MIN_CHANNELS
        and x.numel() >= MIN_NUMEL
        and x.is_contiguous()
        and not x.is_contiguous(memory_format=torch.channels_last)
    )


def channels_last_pool(pool: Callable[..., Any]) -> Callable[..., Any]:
    """``pool`` (a max pool taking the input first), run on a channels_last copy of a row-major
    input where :func:`by_channels_last` holds, its results made row-major again."""

    def run(x: Any, *args: Any) -> Any:
        if not by_channels_last(x):
            return pool(x, *args)
        out = pool(x.contiguous(memory_format=torch.channels_last), *args)
        if isinstance(out, tuple):
            return tuple(o.contiguous() for o in out)
        return out.contiguous()

    return run

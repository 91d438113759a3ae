"""Copies of the caller's tensors that keep their layout: the samples a capture traces."""

from __future__ import annotations

import torch


def layout_clone(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its sizes and strides, gaps and overlaps included, so that what
    depends on the layout (``view`` raising, ``reshape`` choosing to copy) goes as on ``t``.

    Example:
        >>> x = torch.arange(12.0).view(3, 4)[:, :2]
        >>> layout_clone(x).stride()
        (4, 1)
    """
    if t.layout != torch.strided or t.is_conj() or t.is_neg() or t.numel() == 0:
        return t.clone()
    if is_dense(t):
        return t.clone()  # NOTE: a dense tensor's clone keeps its strides (preserve_format)
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    flat = torch.as_strided(t, (span,), (1,), t.storage_offset()).clone()
    return flat.as_strided(t.shape, t.stride(), 0)


def is_dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its memory span exactly once, in some order of its dims
    (a permutation of a contiguous layout)."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if stride != expected:
            return False
        expected *= size
    return True

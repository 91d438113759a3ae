"""The row copy's Triton kernel (``plait.codegen.cuda_row_copy``), run through Triton's
interpreter on CPU tensors: the real columns of padded buffers (aligned or not, one row or
many, leading dims collapsed, special values in place) copied into contiguous tensors with
every bit kept; layouts that are no grid of rows, or a destination that is not contiguous, are
refused and left untouched. The CUDA run: ``tests/gpu/test_cuda_padded_products.py``."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import pytest
import torch

from plait.codegen.cuda_row_copy import copy_rows, rows_of
from tests.util import assert_bitwise

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.int64]


def _padded(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g).to(dtype)
        t.view(-1)[:: max(1, t.numel() // 7)] = float("nan")
        t.view(-1)[1 :: max(1, t.numel() // 5)] = float("-inf")
        t.view(-1)[2 :: max(1, t.numel() // 3)] = -0.0
        return t
    return torch.randint(-(2**40), 2**40, shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,view",
    [
        ((4, 6, 1008), (slice(None), slice(None), slice(0, 1001))),  # NOTE: logits' layout
        ((1, 1, 2056), (slice(None), slice(None), slice(0, 2049))),  # NOTE: one row, 3 blocks
        ((3, 5, 40), (slice(1, 3), slice(None), slice(3, 37))),  # NOTE: rows start unaligned
        ((7, 16), (slice(None), slice(0, 16))),  # NOTE: dense: one row stride, no gap
    ],
)
def test_padded_rows_are_copied_bit_for_bit(
    dtype: torch.dtype, shape: tuple[int, ...], view: tuple[slice, ...]
) -> None:
    src = _padded(len(shape) * 100 + shape[-1], shape, dtype)[view]
    dst = torch.full(src.shape, 7, dtype=dtype)
    assert rows_of(src) is not None
    assert copy_rows(src, dst)
    assert_bitwise(dst, src.contiguous(), f"{dtype} {shape}")


def test_layouts_that_are_no_grid_of_rows_are_refused() -> None:
    base = torch.randn(4, 6, 16)
    refused = [
        base.transpose(0, 1),  # NOTE: rows not evenly spaced
        base[:, 1:4, :8],  # NOTE: leading dims do not collapse
        base[..., ::2],  # NOTE: columns not unit-strided
        torch.randn(16, 8).t(),
        torch.randn(8, 1).expand(8, 4),
    ]
    for src in refused:
        dst = torch.zeros(src.shape)
        assert rows_of(src) is None and not copy_rows(src, dst), (src.shape, src.stride())
        assert not dst.any()
    src = base[..., :8]
    wrong = torch.zeros(8, 6, 4).permute(2, 1, 0)  # NOTE: not contiguous
    assert not copy_rows(src, wrong) and not wrong.any()
    assert not copy_rows(src, torch.zeros(4, 6, 8, dtype=torch.float64))

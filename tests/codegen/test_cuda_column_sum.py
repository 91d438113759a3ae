"""The column sum's Triton kernels (``plait.codegen.cuda_column_sum``: a sum over leading dims,
the bias gradients of a CUDA training step), run through Triton's interpreter on CPU tensors:
judged by the conformance gate against ATen's sum (float64-anchored, fresh draws), the same
bits on every call, non-finite values as ATen's, strided inputs through ATen's sum. The CUDA
run: ``tests/gpu/test_cuda_column_sum.py``."""

from __future__ import annotations

import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import numpy
import pytest
import torch

import plait.conformance
from plait.codegen import cuda_column_sum
from plait.codegen.cuda_column_sum import column_sum, leading_rows
from tests.util import assert_bitwise

CASES = [
    ((4, 8, 96), (0, 1), False),  # NOTE: a bias gradient over (batch, tokens)
    ((300, 200), (0,), True),  # NOTE: several partial rows, a ragged column block
    ((3, 130, 5, 7), (-4, -3), False),
    ((1, 129), (0,), False),  # NOTE: one row
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize(("shape", "dims", "keepdim"), CASES)
def test_column_sum_passes_the_gate(
    shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool, dtype: torch.dtype
) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).to(dtype)
    report = plait.conformance.check(
        lambda t: torch.sum(t, dims, keepdim=keepdim),
        lambda t: column_sum(t, dims, keepdim),
        (x,),
        op_class="reduction",
    )
    assert report.ok, str(report)
    assert_bitwise(column_sum(x, dims, keepdim), column_sum(x, dims, keepdim), "call 2")


def test_non_finite_values_sum_as_atens() -> None:
    x = torch.randn(400, 70)
    x[3, 0] = float("nan")  # NOTE: NaN
    x[5, 1] = float("inf")  # NOTE: +inf
    x[7, 2], x[300, 2] = float("inf"), float("-inf")  # NOTE: inf - inf, in two partial rows
    with numpy.errstate(invalid="ignore"):  # NOTE: the interpreter's numpy warns at inf - inf
        got = column_sum(x, (0,), False)
    expected = torch.sum(x, (0,))
    assert_bitwise(got.isnan(), expected.isnan(), "NaN where ATen's")
    assert got[1].item() == expected[1].item() == float("inf")
    assert bool(got[3:].isfinite().all())


def test_a_strided_input_runs_atens_sum() -> None:
    x = torch.randn(8, 6, 96).transpose(0, 1)
    assert leading_rows(x, (0, 1)) is None
    assert_bitwise(column_sum(x, (0, 1), False), torch.sum(x, (0, 1)), "strided")


class _Launches:
    """Stands in for a kernel: records each launch's grid, runs nothing."""

    def __init__(self) -> None:
        self.grids: list[tuple[int, ...]] = []

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        self.grids.append(tuple(grid))
        return lambda *args, **kwargs: None


# NOTE: a CUDA grid's size per axis (cudaDeviceProp.maxGridSize): 2**31 - 1, 65535, 65535
CUDA_GRID = (2**31 - 1, 65535, 65535)


@pytest.mark.parametrize(
    "shape",
    [
        (65535 * cuda_column_sum.ROWS + 1, 64),  # NOTE: more partial rows than a second axis holds
        (2, 65536 * cuda_column_sum.COLS),  # NOTE: more column blocks than that
        (1 << 24, 96),
    ],
)
def test_launches_fit_a_cuda_grid(shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every launch fits CUDA's grid, whatever the rows and columns (on the meta device: the
    shapes are gigabytes). A grid of (column blocks, partial rows) failed to launch past 8.4M
    rows."""
    partial, final = _Launches(), _Launches()
    monkeypatch.setattr(cuda_column_sum, "_partial", partial)
    monkeypatch.setattr(cuda_column_sum, "_final", final)
    rows, cols = shape
    column_sum(torch.empty(shape, device="meta", dtype=torch.bfloat16), (0,), False)
    for grid in [*partial.grids, *final.grids]:
        assert all(n <= most for n, most in zip(grid, CUDA_GRID)), grid
    blocks = -(-cols // cuda_column_sum.COLS)
    parts = -(-rows // cuda_column_sum.ROWS)
    assert [math.prod(g) for g in partial.grids] == [blocks * parts]

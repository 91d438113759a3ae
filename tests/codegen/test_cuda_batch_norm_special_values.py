"""NaN, infinities and -0.0 through training-mode batch norm's Triton kernels
(codegen.cuda_batch_norm), run by Triton's interpreter on CPU tensors: the results are eager's
CUDA kernels' (emulated where ATen's CPU kernel gives others:
tests.codegen.cuda_batch_norm_eager), NaN and infinities at the same positions, finite values
within the contract's normalization row. A channel whose infinity eager's CUDA thread reads
before its last value has a NaN mean there (Welford's update), where ``sum / n`` (ATen's CPU
kernel, and plait's kernels before) is +-inf."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import pytest
import torch

from plait.codegen import cuda_batch_norm as cbn
from plait.conformance.draws import with_special_values
from tests.codegen.cuda_batch_norm_eager import (
    EPS,
    MOMENTUM,
    SHAPES,
    assert_same_values,
    cuda_batch_mean,
    cuda_forward,
    draw,
    special_draw,
)

aten = torch.ops.aten


def _check(args: tuple[torch.Tensor, ...]) -> None:
    x, w, b, rm, rv, gy = args
    want = cuda_forward(x, w, b, rm, rv)
    got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS)
    for name, g, v in zip(("y", "mean", "invstd", "running_mean", "running_var"), got, want):
        assert_same_values(g, v, name)
    mask = [True, True, True]
    mean, invstd = want[1], want[2]
    want_grads = aten.native_batch_norm_backward(
        gy, x, w, None, None, mean, invstd, True, EPS, mask
    )
    for name, g, v in zip(
        ("dx", "dw", "db"), cbn.backward(gy, x, w, mean, invstd, mask), want_grads
    ):
        assert g is not None
        assert_same_values(g, v, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_special_values_give_eager_cuda_results(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """An infinity read last by its CUDA thread (+inf mean), one anywhere, both signs, an all-NaN
    channel, -0.0, an infinite weight and bias, NaN and inf in the running statistics and the
    output gradient (tests.codegen.cuda_batch_norm_eager.special_draw)."""
    for seed in (1, 2, 3):
        _check(special_draw(seed, shape, dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 3, 9, 11), (16, 4, 32, 32), (40, 6)], ids=str)
def test_the_gates_special_values_draw_gives_eager_cuda_results(
    shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    """NaN, +inf, -inf, -0.0 and +0.0 written into random positions of every input, as the
    conformance gate's special-values draw writes them (an H100 found the kernels' -inf mean of
    a channel whose -inf eager's CUDA thread reads first of two: eager's NaN)."""
    for seed in (4, 5, 6):
        args, _ = with_special_values(draw(seed, shape, dtype), seed)
        _check(args)


def test_a_single_infinity_keeps_its_sign_only_where_read_last() -> None:
    """Eager's CUDA mean of a channel with one -inf: -inf where its thread reads it last (the
    last value of a (5, 3, 99) input, whose threads read rows j and j + 4), NaN where it reads
    another value after it (row 0 then row 4); ATen's CPU kernel gives -inf at both."""
    x = torch.randn(5, 3, 9, 11, generator=torch.Generator().manual_seed(8)) + 2
    x[4, 0, 8, 10], x[0, 1, 7, 10] = -float("inf"), -float("inf")
    mean = cbn.forward(x, None, None, None, None, MOMENTUM, EPS)[1]
    assert mean[0] == -float("inf") and mean[1].isnan(), mean
    assert torch.equal(cuda_batch_mean(x).isnan(), mean.isnan())
    cpu = aten._native_batch_norm_legit.no_stats(x, None, None, True, MOMENTUM, EPS)[1]
    assert (cpu[:2] == -float("inf")).all(), cpu

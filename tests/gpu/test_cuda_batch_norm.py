"""Training-mode batch norm on CUDA runs plait's Triton kernels (``plait.codegen.cuda_batch_norm``),
forward and backward: against ATen's CUDA kernels on fresh random inputs of ResNet-50's shapes
(NaN, infinities and -0.0 written in too, where ATen's CUDA mean is not its CPU kernel's),
and in a convolutional network with residual adds trained under bfloat16 autocast (the gate on
outputs and gradients; the running statistics moved once per step as eager moves them). The
global average's gradient there is a broadcast (``plait.ir.ops.pooling``), eager's within the
contract. Skipped without CUDA."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.codegen import cuda_batch_norm as cbn
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.codegen import cuda_batch_norm_eager as eager
from tests.util import contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

aten = torch.ops.aten
MOMENTUM, EPS = 0.1, 1e-5
MASK = [True, True, True]
# NOTE: bfloat16 at ResNet-50's shapes, judged by the gate anchored on float64; float32 against
# ATen elementwise, with gradients correlated with the input: a channel's gradient sums then do
# not cancel (two float32 orders of a cancelling sum differ beyond the contract's row, ATen's
# own CPU and CUDA kernels too)
SHAPES16 = [(64, 64, 56, 56), (64, 2048, 7, 7), (16, 256, 14, 14), (5, 3, 9, 11)]
SHAPES32 = [(32, 32, 24, 24), (16, 256, 14, 14), (5, 3, 9, 11)]


def _inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: str, correlated: bool = False
) -> Callable[[int], Any]:
    c = shape[1]

    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        mean = torch.randn(1, c, *[1] * (len(shape) - 2), generator=g) * 3
        z = torch.randn(shape, generator=g)
        x = z * 2 + mean
        w, b, rm = (torch.randn(c, generator=g) for _ in range(3))
        rv = torch.rand(c, generator=g) + 0.5
        gy = torch.randn(shape, generator=g)
        if correlated:
            gy = gy * 0.5 + z + 1.0
        return tuple(t.to(device) for t in (x.to(dtype), w, b, rm, rv, gy.to(dtype)))

    return draw


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _aten(x: Any, w: Any, b: Any, rm: Any, rv: Any, gy: Any) -> tuple[torch.Tensor, ...]:
    """ATen's forward, and ATen's backward on the 16-bit values widened to float32: its 16-bit
    CUDA backward sums each channel's ``g * (x - mean)`` terms at the input's precision (the
    gate's float64 anchor measured 0.3% RMS error on ResNet-50's sums), where the contract asks
    for float32 accumulation."""
    out = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
    grads = aten.native_batch_norm_backward(
        _wide(gy), _wide(x), w, None, None, out[1], out[2], True, EPS, MASK
    )
    return (*out, grads[0].to(x.dtype), *grads[1:])


def _kernels(x: Any, w: Any, b: Any, rm: Any, rv: Any, gy: Any) -> tuple[torch.Tensor, ...]:
    out = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS)
    grads = cbn.backward(gy, x, w, out[1], out[2], MASK)
    return (*out, *(t for t in grads if t is not None))


def kernels_pass_the_gate(shape: tuple[int, ...], device: str) -> None:
    """bfloat16 input, float32 statistics (autocast's): the gate, anchored on float64, with its
    special-values draw."""
    report = plait.conformance.check(
        _aten,
        _kernels,
        _inputs(shape, torch.bfloat16, device),
        draws=2,
        op_class="normalization",
        reference64=_aten,
        precision=torch.bfloat16,
    )
    report.raise_if_failed()


@pytest.mark.parametrize("shape", SHAPES16, ids=str)
def test_bfloat16_kernels_pass_the_gate(shape: tuple[int, ...]) -> None:
    """(5, 3, 9, 11) holds the special-values draw on which an H100 found the kernels' batch
    mean -inf where ATen's is NaN: a channel's one -inf, in row 0 of 5, which ATen's thread
    reads before row 4 (its Welford update: ``-inf + (v + inf) / 2``)."""
    kernels_pass_the_gate(shape, "cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [*eager.SHAPES, (8, 64, 56, 56), (3000, 64)], ids=str)
def test_special_values_give_atens_results(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """NaN, infinities and -0.0 where ATen's CUDA kernels part from its CPU kernel (an infinity
    its thread reads last keeps the mean +-inf, one read before another makes it NaN;
    tests.codegen.cuda_batch_norm_eager.special_draw): plait's kernels give ATen's results, NaN
    and infinities at the same positions, and so does the CPU tests' emulation of ATen's mean."""
    for seed in (1, 2, 3):
        x, w, b, rm, rv, gy = (t.cuda() for t in eager.special_draw(seed, shape, dtype))
        want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
        got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS)
        for name, g, v in zip(("y", "mean", "invstd", "running_mean", "running_var"), got, want):
            eager.assert_same_values(g, v, name)
        eager.assert_same_values(eager.cuda_batch_mean(x.cpu()), want[1].cpu(), "emulated mean")
        mean, invstd = want[1], want[2]
        grads = aten.native_batch_norm_backward(
            _wide(gy), _wide(x), w, None, None, mean, invstd, True, EPS, MASK
        )
        mine = cbn.backward(gy, x, w, mean, invstd, MASK)
        for name, g, v in zip(("dx", "dw", "db"), mine, (grads[0].to(x.dtype), *grads[1:])):
            assert g is not None
            eager.assert_same_values(g, v, name)


@pytest.mark.parametrize("shape", SHAPES32, ids=str)
def test_float32_kernels_match_atens(shape: tuple[int, ...]) -> None:
    for seed in (1, 2):
        args = _inputs(shape, torch.float32, "cuda", correlated=True)(seed)
        for got, want in zip(_kernels(*args), _aten(*args)):
            assert got.dtype == want.dtype and got.shape == want.shape
            torch.testing.assert_close(got, want, **contract_tol("normalization", torch.float32))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(self.bn(self.conv(h)) + h)
        return self.head(self.pool(h).flatten(1))


def _draw(seed: int) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(8, 3, 16, 16, generator=gen).cuda(),)


def test_a_residual_network_trains_on_the_kernels() -> None:
    torch.manual_seed(0)
    model = _Block().cuda().train()
    compiled = plait.compile(copy.deepcopy(model))
    gate_bf16_training(model, compiled, _draw, "cuda")
    (spec,) = compiled.specializations
    executor = spec.compiled.manifest.executor
    forward = [n["detail"] for n in executor["evidence"]["nodes"]]
    backward = [n["detail"] for n in executor["backward"]["evidence"]["nodes"]]
    assert sum("plait Triton batch norm (forward" in d for d in forward) == 2, forward
    assert sum("plait Triton batch norm (backward" in d for d in backward) == 2, backward
    # NOTE: the global average's gradient is a broadcast in a Triton kernel, not ATen's call
    assert not any("adaptive_avg_pool2d_backward" in d for d in backward), backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_global_average_gradient_is_eagers(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool2d(torch.relu(x), 1) * 3.0

    compiled = plait.compile(fn)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(2):
        x = torch.randn(8, 32, 7, 7, device="cuda", generator=gen).to(dtype)
        g = torch.randn(8, 32, 1, 1, device="cuda", generator=gen).to(dtype)
        mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        compiled(mine).backward(g)
        fn(ref).backward(g)
        assert mine.grad is not None and ref.grad is not None
        torch.testing.assert_close(mine.grad, ref.grad, **contract_tol("pointwise", dtype))


def test_running_statistics_move_once_per_step() -> None:
    torch.manual_seed(0)
    model = _Block().cuda().train()
    inner = copy.deepcopy(model)
    compiled = plait.compile(inner)
    for seed in (5, 6):
        (x,) = _draw(seed)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(x).float().sum().backward()
            compiled(x).float().sum().backward()
    for name, want in model.state_dict().items():
        got = inner.state_dict()[name]
        if name.endswith("num_batches_tracked"):
            assert torch.equal(got, want), name
        elif "running" in name:
            torch.testing.assert_close(got, want, **contract_tol("normalization", torch.bfloat16))

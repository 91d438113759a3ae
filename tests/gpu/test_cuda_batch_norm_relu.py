"""A training batch norm fused with its ReLU (``plait.passes.fuse_bn_relu``) on CUDA: plait's
Triton kernels apply the ReLU as they store the normalized result and the ReLU's mask as they
read the gradient. Against ATen's CUDA kernels (then relu; the mask then ATen's backward) on
fresh inputs of ResNet-50's shapes, and a conv -> BatchNorm2d -> ReLU network trained under
bfloat16 autocast, judged by the gate; the relu and mask kernels are gone from both programs.
Skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import plait
from plait.codegen import cuda_batch_norm as cbn
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.util import contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

aten = torch.ops.aten
MOMENTUM, EPS = 0.1, 1e-5
MASK = [True, True, True]
SHAPES = [(64, 64, 56, 56), (64, 512, 7, 7), (5, 3, 9, 11)]


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    """A 16-bit input with float32 weights and statistics (autocast's), a gradient correlated
    with the input (a channel's sums then do not cancel), and a ReLU result with zeros, NaN
    and negative values."""
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    z = torch.randn(shape, generator=g)
    x = z * 2 + torch.randn(1, c, 1, 1, generator=g) * 3
    w, b, rm = (torch.randn(c, generator=g) for _ in range(3))
    rv = torch.rand(c, generator=g) + 0.5
    gy = torch.randn(shape, generator=g) * 0.5 + z + 1.0
    y = torch.randn(shape, generator=g)
    flat = y.view(-1)
    flat[::97], flat[1::89] = 0.0, float("nan")
    return tuple(t.cuda() for t in (x.to(dtype), w, b, rm, rv, gy.to(dtype), y.to(dtype)))


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


# NOTE: float32 elementwise against ATen (as tests/gpu/test_cuda_batch_norm.py); bfloat16 is
# judged by the gate in the network below (two orders of a 16-bit sum differ beyond the row)
@pytest.mark.parametrize("dtype", [torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_kernels_match_atens(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    for seed in (1, 2):
        x, w, b, rm, rv, gy, y = _inputs(shape, dtype, seed)
        want = aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
        got = cbn.forward(x, w, b, rm, rv, MOMENTUM, EPS, relu=True)
        tol = contract_tol("normalization", dtype)
        torch.testing.assert_close(got[0], torch.relu(want[0]), **tol)
        for a, e in zip(got[1:], want[1:], strict=True):
            torch.testing.assert_close(a, e, **contract_tol("normalization", torch.float32))
        # NOTE: ATen's 16-bit CUDA backward sums at the input's precision; the contract asks for
        # float32 accumulation: its backward on the values widened to float32
        masked = torch.where(torch.le(y, 0), 0.0, gy)
        grads = aten.native_batch_norm_backward(
            _wide(masked), _wide(x), w, None, None, want[1], want[2], True, EPS, MASK
        )
        mine = cbn.backward(gy, x, w, want[1], want[2], MASK, relu_out=y)
        expected = (grads[0].to(dtype), *grads[1:])
        for a, e in zip(mine, expected, strict=True):
            assert a is not None and a.dtype == e.dtype
            torch.testing.assert_close(a, e, **contract_tol("normalization", e.dtype))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(self.bn(self.conv(h)) + h)  # NOTE: the residual add: not fused
        return self.head(self.pool(h).flatten(1))


def _draw(seed: int) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(8, 3, 16, 16, generator=gen).cuda(),)


def test_a_network_trains_on_the_fused_kernels() -> None:
    torch.manual_seed(0)
    model = _Block().cuda().train()
    compiled = plait.compile(copy.deepcopy(model))
    gate_bf16_training(model, compiled, _draw, "cuda")
    (spec,) = compiled.specializations
    m = spec.compiled.manifest
    fired = {
        half: [r["rule"] for p in m.autograd["passes"][half] for r in p["rewrites"]]
        for half in ("forward", "backward")
    }
    assert fired["forward"].count("fuse-bn-relu.forward") == 1, fired
    assert fired["backward"].count("fuse-bn-relu.backward") == 1, fired
    forward = m.executor["evidence"]["nodes"]
    backward = m.executor["backward"]["evidence"]["nodes"]
    fused = [n["detail"] for n in forward if n["op"] == "batch_norm_relu"]
    assert len(fused) == 1 and fused[0].startswith("plait Triton batch norm (forward with"), fused
    masked = [n["detail"] for n in backward if n["op"] == "batch_norm_relu_backward"]
    assert len(masked) == 1 and masked[0].startswith("plait Triton batch norm (backward with")
    # NOTE: one relu left in the forward (after the residual add), none fused away wrongly
    assert sum(n["op"] == "relu" for n in forward) == 1, forward

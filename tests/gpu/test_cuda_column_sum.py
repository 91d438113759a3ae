"""Sums over leading dims on CUDA (bias and layer-norm parameter gradients) run plait's Triton
column sum (``plait.codegen.cuda_column_sum``) instead of ATen's reduction: the kernels judged
by the gate on CUDA tensors at a training step's shapes, and a bfloat16 training step whose
bias gradients take them passes the gate (outputs and gradients). Skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import plait
import plait.conformance
from plait.codegen.cuda_column_sum import column_sum
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.util import assert_bitwise

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(8, 512, 768), (8, 512, 3072), (4096, 2304), (3, 5, 70)])
def test_column_sum_on_cuda_passes_the_gate(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    dims = tuple(range(len(shape) - 1))
    x = torch.randn(shape, device="cuda").to(dtype)
    report = plait.conformance.check(
        lambda t: torch.sum(t, dims), lambda t: column_sum(t, dims, False), (x,),
        op_class="reduction",
    )  # fmt: skip
    assert report.ok, str(report)
    assert_bitwise(column_sum(x, dims, False), column_sum(x, dims, False), "call 2")


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(64, 256), nn.Linear(256, 64), nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def test_a_training_step_sums_its_bias_gradients_in_triton() -> None:
    torch.manual_seed(0)
    model = _Mlp().cuda().train()
    compiled = plait.compile(copy.deepcopy(model))

    def draw(seed: int) -> tuple[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(4, 128, 64, generator=gen).cuda(),)

    gate_bf16_training(model, compiled, draw, "cuda")
    (spec,) = compiled.specializations
    nodes = spec.compiled.manifest.executor["backward"]["evidence"]["nodes"]
    sums = [n for n in nodes if "Triton column sum" in n["detail"]]
    assert len(sums) >= 2, [n["detail"] for n in nodes]

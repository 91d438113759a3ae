"""CUDA programs whose Triton kernels share templates with the CPU's, against CUDA eager on fresh
inputs: layer norm and group norm of rows holding one value (the corrected two-pass moments:
``x - mean`` exactly 0, NaN with ``eps=0``), and a squeeze-and-excitation gate whose sigmoid is
computed once and read broadcast by the scaling kernel. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from tests.util import contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _close(got: torch.Tensor, want: torch.Tensor, op_class: str, what: str) -> None:
    tol = contract_tol(op_class, want.dtype)
    torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)


@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_layer_norm_of_equal_rows_answers_as_cuda_eager(eps: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    weight = torch.randn(5, 7, device="cuda", generator=gen)
    bias = torch.randn(5, 7, device="cuda", generator=gen)

    def fn(a: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(a * 1.0, (5, 7), weight, bias, eps=eps)

    compiled = plait.compile(fn, options={"cache": False})
    with torch.no_grad():
        for _ in range(2):
            value = torch.randn(3, 4, 1, 1, device="cuda", generator=gen) * 10
            x = value.expand(3, 4, 5, 7).contiguous()
            x[0, 0] = torch.randn(5, 7, device="cuda", generator=gen)
            _close(compiled(x.clone()), fn(x.clone()), "normalization", f"layer_norm eps={eps}")


@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_group_norm_of_equal_groups_answers_as_cuda_eager(eps: float) -> None:
    gen = torch.Generator(device="cuda").manual_seed(4)

    def fn(a: torch.Tensor) -> torch.Tensor:
        return F.group_norm(a * 1.0, 2, eps=eps)

    compiled = plait.compile(fn, options={"cache": False})
    with torch.no_grad():
        for _ in range(2):
            value = torch.randn(3, 2, 1, 1, 1, device="cuda", generator=gen) * 10
            x = value.expand(3, 2, 3, 5, 7).reshape(3, 6, 5, 7).contiguous()
            x[0, :3] = torch.randn(3, 5, 7, device="cuda", generator=gen)
            _close(compiled(x.clone()), fn(x.clone()), "normalization", f"group_norm eps={eps}")


class SqueezeExcite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.reduce = nn.Conv2d(32, 8, 1)
        self.expand = nn.Conv2d(8, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        gate = torch.sigmoid(self.expand(F.silu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))
        return x * gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_squeeze_excite_answers_as_cuda_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(5)
    model = SqueezeExcite().eval().to("cuda", dtype)
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator(device="cuda").manual_seed(6)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 32, 14, 14, device="cuda", generator=gen).to(dtype)
            _close(compiled(x), model(x), "conv", f"squeeze-excite {dtype}")

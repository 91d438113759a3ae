"""Rounding division of two 16-bit CUDA tensors, against CUDA eager bit for bit: CUDA's kernels
truncate the quotient rounded to the 16-bit type (as the CPU's do) and floor the float32
quotient (measured on an H100). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize(
    ("dtype", "mode"),
    [(torch.bfloat16, "trunc"), (torch.float16, "trunc"), (torch.bfloat16, "floor")],
    ids=["bf16-trunc", "f16-trunc", "bf16-floor"],
)
def test_rounding_division_matches_cuda_eager(dtype: torch.dtype, mode: str) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.div(a, b, rounding_mode=mode)

    compiled = plait.compile(fn)
    for seed in range(2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        a = (torch.randn(20000, device="cuda", generator=g) * 100).to(dtype)
        b = torch.randn(20000, device="cuda", generator=g).to(dtype)
        got, want = compiled(a, b), fn(a, b)
        assert torch.equal(got.isnan(), want.isnan())
        assert_bitwise(got.nan_to_num(0.0), want.nan_to_num(0.0), f"{dtype} {mode} draw {seed}")

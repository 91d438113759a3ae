"""``clamp`` with a NaN scalar bound: eager fills the whole result with NaN (ATen's clamp checks
its scalar bounds before the loop), for a float tensor and for an integer or bool tensor, which a
float bound promotes to the default float dtype."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise

NAN = float("nan")


def _operand(dtype: torch.dtype, n: int) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(n) > 0.5
    if dtype.is_floating_point:
        return torch.randn(n, dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), dtype=dtype)


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.float32]
)
@pytest.mark.parametrize(
    "bounds", [{"min": NAN}, {"max": NAN}, {"min": NAN, "max": 3.0}, {"min": -3.0, "max": NAN}]
)
def test_clamp_by_a_nan_scalar_is_nan_everywhere(dtype: torch.dtype, bounds: dict) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x * 1, **bounds) + 1

    compiled = plait.compile(f)
    for n in (1, 17):
        for _ in range(2):
            x = _operand(dtype, n)
            assert_bitwise(compiled(x), f(x), f"clamp({bounds}) of {dtype}[{n}]")

"""``nan_to_num(x, nan=-0.0)`` writes -0.0 where ``x`` is NaN, as eager does (a -0.0
replacement is falsy in Python and must not become the default +0.0)."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 17])
def test_nan_to_num_keeps_a_negative_zero_replacement(dtype: torch.dtype, n: int) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(x * 2, nan=-0.0, posinf=-0.0, neginf=-0.0)

    compiled = plait.compile(f)
    for _ in range(2):
        x = torch.randn(n, dtype=dtype)
        x[torch.rand(n) < 0.5] = float("nan")
        x[0] = float("nan")
        assert_bitwise(compiled(x), f(x), f"nan_to_num of {dtype}[{n}]")

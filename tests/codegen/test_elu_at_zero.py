"""``elu`` at x = +-0 returns x (times scale) whatever alpha is: eager's kernels take the
``expm1`` branch only below zero, so a negative, infinite or NaN alpha does not reach a zero
(``0 * -1`` would be -0.0, ``0 * inf`` NaN)."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise


@pytest.mark.parametrize("alpha", [1.0, -1.0, -0.0, float("inf"), float("nan")])
@pytest.mark.parametrize("n", [1, 17])
def test_elu_of_a_zero_is_that_zero(alpha: float, n: int) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.elu(x * 1, alpha)

    compiled = plait.compile(f)
    for _ in range(2):
        x = torch.randn(n).abs()  # NOTE: zeros and positives: both branches exact
        x[torch.rand(n) < 0.5] = 0.0
        x[0] = -0.0
        assert_bitwise(compiled(x), f(x), f"elu(alpha={alpha}) of float32[{n}]")

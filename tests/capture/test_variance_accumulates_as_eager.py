"""``torch.var`` of a CPU float tensor compiles to a variance accumulated in float64, as eager's
CPU kernel accumulates it (ATen's ``WelfordOps<scalar_t, double>``): a float32 sum of squared
deviations overflows where the variance itself is finite (1000 values of magnitude 1e18: eager
about 1e36, a float32 accumulation inf), and a float32 mean overflows for a row of equal large
values (eager 0). Values of ordinary magnitude keep eager's values within the contract."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from tests.util import contract_tol

CASES: dict[str, Callable[[torch.Tensor], Any]] = {
    "last_dim": lambda x: x.var(-1),
    "population": lambda x: torch.var(x, -1, correction=0),
    "first_dim_kept": lambda x: x.var(0, keepdim=True),
    "whole_tensor": lambda x: x.var(),
}


def _draw(seed: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, 1000, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1.0, 1e18])
@pytest.mark.parametrize("name", sorted(CASES))
def test_variance_matches_eager_over_the_float_range(
    name: str, scale: float, dtype: torch.dtype
) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1, 2):  # NOTE: the capture draw, then two fresh ones
        x = _draw(seed, scale, dtype)
        got, want = compiled(x), fn(x)
        assert bool(want.isfinite().all()), "eager's variance is finite here"
        torch.testing.assert_close(got, want, **contract_tol("reduction", dtype))


def test_variance_of_equal_large_values_is_zero_as_in_eager() -> None:
    fn = CASES["last_dim"]
    compiled = plait.compile(fn, fullgraph=True)
    for value in (1e37, 3e38, 2.5):
        x = torch.full((3, 100), value)
        got, want = compiled(x), fn(x)
        assert want.eq(0).all()
        torch.testing.assert_close(got, want, **contract_tol("reduction", torch.float32))

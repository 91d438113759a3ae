"""Truncating division of bfloat16/float16 tensors truncates eager's 16-bit quotient.

ATen's tensor-by-tensor kernel divides in the 16-bit type (the quotient rounded to 16 bits), then
truncates: bf16 -5.125 / 0.466796875 is -10.979 in float32, -11.0 in bfloat16, and eager's answer
is -11. The kernel truncated the float32 quotient (-10), a third off. A second operand of one
element is read at float precision and the quotient is not rounded (ATen's ``is_scalar`` path),
so there float32's quotient is truncated. Quotients near integers make the difference show;
results must equal eager's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from tests.util import assert_bitwise

CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "tensor": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
    "scalar_divisor": lambda x, y: torch.div(x, 0.3, rounding_mode="trunc"),
    "scalar_dividend": lambda x, y: torch.div(torch.tensor(1.3), y, rounding_mode="trunc"),
    "in_chain": lambda x, y: torch.div(x * 2, y + 1, rounding_mode="trunc") - x,
}


def _draw(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Dividends just short of integer multiples of the divisors (both signs)."""
    gen = torch.Generator().manual_seed(seed)
    y = (torch.rand(8192, generator=gen) * 4 + 0.1).to(dtype)
    k = torch.randint(-20, 20, (8192,), generator=gen).float()
    x = y.float() * k * (1 - 1e-3 * torch.rand(8192, generator=gen))
    return x.to(dtype), y


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_truncating_division_matches_eager(name: str, dtype: torch.dtype) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, backend="stax")
    with torch.no_grad():
        for seed in range(2):
            x, y = _draw(seed, dtype)
            assert_bitwise(compiled(x, y), fn(x, y), f"{name} {dtype} draw {seed}")

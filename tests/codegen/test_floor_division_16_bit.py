"""Floor division of two 16-bit float tensors is ATen's, step by step in the 16-bit type: its
vectorized kernel rounds ``(a - fmod(a, b)) / b`` and each correction to bfloat16/float16, so
its result can differ by one from the floor of the exact quotient (bf16 19072 // -84.5 is -227
in eager, -226 computed in float32: 691 of 10,000 random pairs differed). A one-element divisor
keeps ATen's float32 path. Compared bit for bit with eager on fresh draws."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise

DTYPES = [torch.bfloat16, torch.float16]


def _pairs(dtype: torch.dtype, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    a = (torch.randn(n, generator=g) * 100).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return a, b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [7, 1000, 4099])
def test_floor_division_matches_eager(dtype: torch.dtype, n: int) -> None:
    compiled = plait.compile(lambda a, b: a // b)
    for seed in range(2):
        a, b = _pairs(dtype, n, torch.Generator().manual_seed(seed))
        assert_bitwise(compiled(a, b), a // b, f"{dtype} n={n} draw {seed}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_floor_division_function_forms_and_special_values(dtype: torch.dtype) -> None:
    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.div(a, b, rounding_mode="floor") + torch.floor_divide(b, a)

    compiled = plait.compile(fn)
    g = torch.Generator().manual_seed(3)
    a, b = _pairs(dtype, 512, g)
    b[::7] = 0.0  # NOTE: a zero divisor gives a / b
    a[::11] = -0.0
    a[::13] = float("inf")
    b[::17] = float("nan")
    got, want = compiled(a, b), fn(a, b)
    # NOTE: NaN where eager's is; its payload bits are the kernel's own (eager's vector blend
    # makes all-ones NaNs), so NaNs compare by position and every other element by its bits
    assert torch.equal(got.isnan(), want.isnan())
    assert_bitwise(got.nan_to_num(0.0), want.nan_to_num(0.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_integer_by_16_bit_and_one_element_divisor(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(5)
    ints = torch.randint(-30000, 30000, (1000,), generator=g, dtype=torch.int16)
    _, b = _pairs(dtype, 1000, g)
    compiled = plait.compile(lambda a, b: a // b)
    assert_bitwise(compiled(ints, b), ints // b)
    one = b[:1].clone()
    assert_bitwise(compiled(ints, one), ints // one)

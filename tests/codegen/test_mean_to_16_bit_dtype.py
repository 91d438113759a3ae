"""``mean(x, dtype=float16/bfloat16)`` on the CPU: eager sums ``x`` converted to float32 (not
rounded to 16 bits element by element), divides, and rounds the mean once (ATen's ``mean_out``:
"cast_fp32 -> sum -> div -> cast_bf16_or_fp16"). An int32 tensor's values overflow float16, so
rounding them first turned a finite mean into NaN."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise, contract_tol


def _operand(dtype: torch.dtype, n: int) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(n, dtype=dtype) * 1e5
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), dtype=dtype)


@pytest.mark.parametrize("source", [torch.int32, torch.int16, torch.int64, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mean_to_a_16_bit_dtype_sums_in_float32(source: torch.dtype, dtype: torch.dtype) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dtype=dtype)

    compiled = plait.compile(f)
    for n in (1, 17):
        for _ in range(2):
            x = _operand(source, n)
            got, want = compiled(x), f(x)
            if n == 1:  # NOTE: one element: no summation order, the same bits
                assert_bitwise(got, want, f"mean({source}[{n}], dtype={dtype})")
            torch.testing.assert_close(got, want, **contract_tol("reduction", dtype))

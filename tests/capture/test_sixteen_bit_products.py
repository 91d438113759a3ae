"""A product of 16-bit floats (``prod`` of a bfloat16 or float16 tensor, or with ``dtype=`` one
of them) is eager's own: eager multiplies in 16 bits, rounding each partial product, where the
IR's ``prod`` accumulates in float32 (100 bfloat16 factors of 1 to 3: 2.4e27 against eager's
2.5e27, 3% apart, twice the contract's budget). As for ``nansum``, the rule refuses such a
product and the call runs ATen's kernel; a product accumulated in float32 keeps the IR's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from tests.util import assert_bitwise, contract_tol

CASES: dict[str, Callable[[torch.Tensor], Any]] = {
    "rows": lambda x: x.prod(-1),
    "columns_kept": lambda x: torch.prod(x, 0, keepdim=True),
    "whole": lambda x: x.prod(),
}


def _draw(seed: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(7, 100, generator=g) * 2 + 0.5).to(dtype)


def _ops(compiled: Any) -> list[str]:
    return [n["op"] for n in compiled.specializations[-1].manifest.executor["evidence"]["nodes"]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_sixteen_bit_product_is_eagers(name: str, dtype: torch.dtype) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn)
    for seed in (0, 1, 2):  # NOTE: the capture draw, then two fresh ones
        x = _draw(seed, dtype)
        assert_bitwise(compiled(x), fn(x), f"{name} draw {seed}")
    assert "prod" not in _ops(compiled)


def test_product_into_float32_stays_native() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.prod(-1, dtype=torch.float32)

    compiled = plait.compile(fn)
    for seed in (0, 1):
        x = _draw(seed, torch.bfloat16)
        torch.testing.assert_close(compiled(x), fn(x), **contract_tol("reduction", torch.float32))
    assert "prod" in _ops(compiled)

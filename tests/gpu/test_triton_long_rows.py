"""A Triton reduction over a row of 2**31 elements or more runs to the row's end on a GPU (the
printed loops are checked on the CPU: tests/codegen/test_triton_long_rows.py). The row was
summed to 0 on an H200. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

import plait

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_a_row_past_int32_sums_to_eagers_total() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(-100, 100, (2**31 + 5000,), dtype=torch.int8, device="cuda", generator=gen)
    compiled = plait.compile(lambda t: t.sum(), backend="stax", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), x.sum())

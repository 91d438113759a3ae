"""Linears of symbolic row count run MKL's packed GEMM packed per row count: a result does not
depend on the calls before it, and a weight written in place is packed again."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.codegen.mkl_rows import KEPT, RowPacks
from plait.codegen.onednn_postops import mkl_linear_available
from tests.util import assert_bitwise

pytestmark = pytest.mark.skipif(not mkl_linear_available(), reason="needs MKL's packed linear")


def test_a_result_does_not_depend_on_the_sizes_before_it() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8)).eval()
    compiled = plait.compile(
        model, dynamic=True, options={"cache": False, "stax": {"timed_matmul": False}}
    )
    xs = {n: torch.randn(n, 64) for n in (2, 3, 7, 40, 5, 9)}
    with torch.no_grad():
        first = {n: compiled(x) for n, x in xs.items()}
        for n in reversed(list(xs)):
            assert_bitwise(compiled(xs[n]), first[n])
    assert len(compiled.specializations) == 1
    nodes = compiled.specializations[0].manifest.executor["evidence"]["nodes"]
    per_rows = "MKL packed linear (weight packed per row count"
    assert any(n["detail"].startswith(per_rows) for n in nodes)


def test_packs_follow_the_weight_and_keep_the_latest_counts() -> None:
    packs = RowPacks()
    w = torch.randn(16, 8)
    first = packs(w, 3)
    for rows in range(4, 4 + KEPT):
        packs(w, rows)
    assert 3 not in packs.packs and len(packs.packs) == KEPT
    assert packs(w, 3) is not first  # NOTE: packed again, the same way
    kept = packs(w, 5)
    w.add_(1.0)
    assert packs(w, 5) is not kept and list(packs.packs) == [5]

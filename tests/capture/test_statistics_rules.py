"""``cov``, ``corrcoef`` and ``combinations`` compile to plait's own ops (no opaque node, no
fallback) and compute eager's values on fresh draws: ``cov`` and ``combinations`` bitwise (the
rules keep ATen's order of arithmetic: ``sum / n``, one ``mm``, ``/ factor``; combinations only
copies), ``corrcoef`` within the contract (eager's vectorized float32 ``sqrt`` is not always
correctly rounded; Stax's is)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise

TOL = plait.contract.load()
CASES: dict[str, tuple[Callable[..., Any], tuple[int, ...]]] = {
    "cov_rows": (torch.cov, (3, 6)),
    "cov_vector": (torch.cov, (7,)),
    "cov_population": (lambda x: torch.cov(x, correction=0), (2, 5)),
    "cov_method": (lambda x: x.cov(correction=2), (4, 9)),
    "corrcoef": (torch.corrcoef, (4, 5)),
    "corrcoef_vector": (torch.corrcoef, (5,)),
    "combinations": (torch.combinations, (5,)),
    "combinations_r3_replacement": (
        lambda x: torch.combinations(x, 3, with_replacement=True),
        (4,),
    ),
    "combinations_too_few": (lambda x: torch.combinations(x, 3), (2,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_statistics_rule_matches_eager_bitwise(name: str) -> None:
    fn, shape = CASES[name]
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1, 2):  # NOTE: the capture draw, then two fresh ones
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        got, want = compiled(x), fn(x)
        if name.startswith("corrcoef"):
            tol = TOL.tolerance("matmul", torch.float32)
            assert got.shape == want.shape and got.dtype == want.dtype
            bound = tol.atol + tol.rtol * want.abs()
            assert bool(((got - want).abs() <= bound).all()), f"{name} draw {seed}"
        else:
            assert_bitwise(got, want, f"{name} draw {seed}")
    (spec,) = compiled.specializations
    assert spec.opaque_counts == {} and spec.fallback_reason is None
    assert spec.manifest.graph.get("aten_externs", {}) == {}


def test_cov_with_weights_is_reported_not_lowered() -> None:
    # NOTE: weights have no rule; ATen's graph reads data (w_sum != 0): an opaque node, warned
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.cov(x, aweights=w)

    compiled = plait.compile(fn)
    x, w = torch.randn(3, 6), torch.rand(6) + 0.5
    with pytest.warns(CaptureFallbackWarning):
        got = compiled(x, w)
    assert_bitwise(got, fn(x, w), "cov with aweights")
    (spec,) = compiled.specializations
    assert spec.opaque_counts == {"torch.cov": 1}
    # NOTE: the manifest says why the ATen path refused it (ATen reads w_sum != 0 from a tensor)
    (record,) = [r for r in spec.manifest.fallbacks if r["what"] == "opaque torch.cov ×1"]
    assert "no ATen program" in record["reason"] and "aten.equal" in record["reason"], record

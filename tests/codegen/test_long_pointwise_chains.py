"""A long chain of pointwise ops, each read once, is not inlined into one expression without
bound: the lowering and the printers walk an inlined expression recursively, so a chain of a
few hundred ops (a sum over a tensor's columns written as a Python loop, a polynomial by
Horner's rule) crashed the compile with a RecursionError. A value whose inlined expression
grows past a bound is materialized, and the chain runs as several kernels."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import plait
from plait.codegen import lower
from tests.util import contract_tol


def _column_sum(x: torch.Tensor) -> torch.Tensor:
    return sum(x[:, i] for i in range(x.size(1)))  # type: ignore[return-value]


def _horner(x: torch.Tensor) -> torch.Tensor:
    y = torch.zeros_like(x)
    for k in range(400):
        y = y * x + (k % 7 - 3) / 8
    return y


@pytest.mark.parametrize("fn, cols", [(_column_sum, 256), (_column_sum, 1000), (_horner, 8)])
def test_long_chain_compiles_and_matches_eager(fn, cols) -> None:
    compiled = plait.compile(fn, fullgraph=True, options={"cache": False})
    gen = torch.Generator().manual_seed(cols)
    for _ in range(2):
        x = torch.rand(3, cols, generator=gen) - 0.5
        torch.testing.assert_close(compiled(x), fn(x), **contract_tol("model", torch.float32))
    manifest = compiled.specializations[-1].compiled.manifest
    assert not manifest.fallbacks


def test_a_kernel_lowers_each_member_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning a chain of n same-shaped members lowers each value a bounded number of times
    (it lowered the whole open kernel again for every member joining it: n^2/2)."""
    produced = [0]
    original = lower.Lowerer.produce

    def counting(self: lower.Lowerer, v: Any, idx: Any) -> Any:
        produced[0] += 1
        return original(self, v, idx)

    monkeypatch.setattr(lower.Lowerer, "produce", counting)
    counts = {}
    for cols in (100, 400):
        produced[0] = 0
        compiled = plait.compile(_column_sum, fullgraph=True, options={"cache": False})
        x = torch.rand(3, cols, generator=torch.Generator().manual_seed(cols)) - 0.5
        torch.testing.assert_close(
            compiled(x), _column_sum(x), **contract_tol("model", torch.float32)
        )
        counts[cols] = produced[0]
    assert counts[400] < 6 * counts[100], counts  # NOTE: linear: 4x; quadratic was about 16x

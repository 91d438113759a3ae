"""A long chain of pointwise ops, each read once, is not inlined into one expression without
bound: the lowering and the printers walk an inlined expression recursively, so a chain of a
few hundred ops (a sum over a tensor's columns written as a Python loop, a polynomial by
Horner's rule) crashed the compile with a RecursionError. A value whose inlined expression
grows past a bound is materialized, and the chain runs as several kernels."""

from __future__ import annotations

import pytest
import torch

import plait
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

"""The same tensor passed twice (``f(x, x)``) is one tensor under capture, as in eager.

Capture traced each input tensor through a tracer of its own, so ``a is b`` read False for
``f(x, x)`` and nothing guarded it: a program branching on it (``if a is b``, as
``nn.MultiheadAttention`` does on ``query is key``) ran the other branch, silently. Now a tensor
met again among the call's inputs is traced as the first one, and the pattern of identical
input tensors is guarded: a call passing other tensors (or the same ones in another pattern)
compiles again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from tests.cache.helpers import status
from tests.util import contract_tol

TOL = contract_tol("pointwise", torch.float32)


def branch_on_identity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a is b:
        return a * 3.0 + 1.0
    return a * b - 1.0


class ThreeInputs(nn.Module):
    """Which of its inputs are one tensor decides its result."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        out = a.sin()
        if b is a:
            out = out + 2.0
        if c is b:
            out = out * 3.0
        if c is a:
            out = out - 5.0
        return out + b * c


def _draws(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 6, generator=g) for _ in range(n)]


@pytest.mark.parametrize("first", ["same", "distinct"])
def test_identity_branch_matches_eager_in_either_order(first: str) -> None:
    compiled = plait.compile(branch_on_identity, backend="stax", options={"cache": False})
    order = ["same", "distinct"] if first == "same" else ["distinct", "same"]
    for k, kind in enumerate(order * 2):
        x, y = _draws(2, seed=10 + k)
        args = (x, x) if kind == "same" else (x, y)
        torch.testing.assert_close(compiled(*args), branch_on_identity(*args), **TOL)
    assert len(compiled.specializations) == 2


@pytest.mark.parametrize(
    "pattern", [(0, 1, 2), (0, 0, 2), (0, 1, 1), (0, 1, 0), (0, 0, 0)], ids=str
)
def test_each_pattern_of_identical_inputs_matches_eager(pattern: tuple[int, int, int]) -> None:
    """Every pattern compiled after every other: each call's result is eager's."""
    model = ThreeInputs()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    patterns = [(0, 1, 2), (0, 0, 2), (0, 1, 1), (0, 1, 0), (0, 0, 0)]
    for k, p in enumerate([pattern, *patterns]):
        draws = _draws(3, seed=20 + k)
        args = [draws[i] for i in p]
        torch.testing.assert_close(compiled(*args), model(*args), **TOL)


def test_guard_failure_names_the_identical_inputs() -> None:
    compiled = plait.compile(branch_on_identity, backend="stax", options={"cache": False})
    x, y = _draws(2, seed=30)
    compiled(x, x)
    compiled(x, y)
    reasons = " ".join(str(r) for r in compiled.recompile_reasons)
    assert "b is a" in reasons, reasons


def test_saved_program_of_identical_inputs_is_not_taken_for_distinct_ones(
    tmp_path: Path,
) -> None:
    """A warm start guards the pattern it was captured with, not the caller's."""
    options = {"cache": str(tmp_path)}
    x, y = _draws(2, seed=40)
    cold = plait.compile(branch_on_identity, backend="stax", options=options)
    torch.testing.assert_close(cold(x, x), branch_on_identity(x, x), **TOL)
    assert status(cold.specializations[-1]) == "miss"
    warm = plait.compile(branch_on_identity, backend="stax", options=options)
    torch.testing.assert_close(warm(x, y), branch_on_identity(x, y), **TOL)
    torch.testing.assert_close(warm(y, y), branch_on_identity(y, y), **TOL)
    assert [status(s) for s in warm.specializations] == ["miss", "hit"]

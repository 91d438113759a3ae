"""A call tries the specialization that admitted the latest call first: one whose guards went
stale for good (a Python value the program reads changed and stayed changed) is not checked
again while a later one admits the calls, and admits them again, with its own values, once the
value changes back."""

from __future__ import annotations

from typing import Any

import torch

import plait
from tests.conformance.models import randn
from tests.util import contract_tol

SETTING = {"scale": 2.0}


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * SETTING["scale"] + x


def _counting(spec: Any) -> list[int]:
    """Each check of ``spec``'s guards appends to the returned list."""
    checked: list[int] = []
    real = spec.guards.holds

    def holds(env: Any) -> bool:
        checked.append(1)
        return bool(real(env))

    spec.guards.holds = holds
    return checked


def test_a_stale_specialization_is_not_checked_while_a_later_one_admits_the_calls() -> None:
    SETTING["scale"] = 2.0
    compiled = plait.compile(_scaled)
    tol = contract_tol("pointwise", torch.float32)
    try:
        x = randn(4, 6, seed=1)
        torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        SETTING["scale"] = 3.0
        x = randn(4, 6, seed=2)
        torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        first, second = compiled.specializations
        checked = _counting(first)
        for seed in (3, 4, 5):
            x = randn(4, 6, seed=seed)
            torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        assert checked == [] and second.calls == 4 and first.calls == 1
        SETTING["scale"] = 2.0  # NOTE: back: the first one admits the call, nothing compiles
        x = randn(4, 6, seed=6)
        torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        assert len(compiled.specializations) == 2 and first.calls == 2 and checked == [1]
        x = randn(4, 6, seed=7)
        torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        assert first.calls == 3 and checked == [1, 1]  # NOTE: now first in the order
    finally:
        SETTING["scale"] = 2.0

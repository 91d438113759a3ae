"""The order a call tries specializations in: one whose guards on the Python values the program
read went stale (a value changed and stayed changed) goes last once a later one admits a call,
so it is checked once, not at every call; it admits calls again, with its own values, once the
value changes back. A static specialization stays ahead of the symbolic one made after it."""

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
        assert checked == [1] and second.calls == 4 and first.calls == 1  # NOTE: then last
        SETTING["scale"] = 2.0  # NOTE: back: the first one admits the call, nothing compiles
        x = randn(4, 6, seed=6)
        torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        assert len(compiled.specializations) == 2 and first.calls == 2 and checked == [1, 1]
        x = randn(4, 6, seed=7)
        torch.testing.assert_close(compiled(x), _scaled(x), **tol)
        assert first.calls == 3 and checked == [1, 1, 1]  # NOTE: the second one went last
        assert second.calls == 4
    finally:
        SETTING["scale"] = 2.0


def test_a_static_specialization_stays_ahead_of_the_symbolic_one_made_after_it() -> None:
    compiled = plait.compile(lambda x: torch.tanh(x) * 2.0 + x)
    tol = contract_tol("pointwise", torch.float32)
    for seed, rows in enumerate((4, 6, 9, 4, 4), start=10):
        x = randn(rows, 5, seed=seed)
        torch.testing.assert_close(compiled(x), torch.tanh(x) * 2.0 + x, **tol)
    static, symbolic = compiled.specializations
    assert static.graph.inputs[0].type.is_static
    assert not symbolic.graph.inputs[0].type.is_static
    assert static.calls == 3 and symbolic.calls == 2  # NOTE: 4 rows: the static one ran

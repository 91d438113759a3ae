"""The public artifact protocol of compiled callables (what plait.conformance drives): the
specializations with the user calls each ran and their settings, and pinned calls that never
compile."""

from __future__ import annotations

import pytest
import torch

import plait
import plait.conformance
from plait.api import SpecializationMissError
from tests.util import linear_called_at_high_precision


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_uses_record_user_calls_and_their_settings() -> None:
    f = plait.compile(lambda x: x.tanh() * 3, options={"cache": False})
    with torch.no_grad():
        f(_x(4))
        f(_x(4, seed=1))
    f(_x(5))
    uses = f.specialization_uses()
    assert [u.calls for u in uses] == [2, 1]
    assert [u.settings["torch.is_grad_enabled()"] for u in uses] == [False, True]
    assert uses[0].key != uses[1].key and len(uses[0].key) == 32
    assert uses[0].guards == tuple(f.specializations[0].guards.texts())
    assert uses[0].manifest is f.specializations[0].manifest


def test_a_pinned_call_runs_that_specialization_only_and_is_not_counted() -> None:
    f = plait.compile(lambda x: x.tanh() * 3, options={"cache": False})
    with torch.no_grad():
        f(_x(4))
    use = f.specialization_uses()[0]
    x = _x(4, seed=2)
    with use.applied():
        assert f.guard_failures(use.key, x) == []
        torch.testing.assert_close(f.call_specialization(use.key, x), x.tanh() * 3)
    # NOTE: outside no_grad the guards refuse it; the pinned call never compiles another
    refused = f.guard_failures(use.key, x)
    assert any("torch.is_grad_enabled() == False" in r for r in refused), refused
    with pytest.raises(SpecializationMissError, match="is_grad_enabled"):
        f.call_specialization(use.key, x)
    with pytest.raises(KeyError, match="no specialization"):
        f.call_specialization("0" * 32, x)
    assert len(f.specializations) == 1 and f.specialization_uses()[0].calls == 1


def test_specialize_makes_the_first_specialization_without_running_or_counting() -> None:
    f = plait.compile(lambda x: x * 2, options={"cache": False})
    with torch.no_grad():
        made = f.specialize(_x(3))
        assert made.calls == 0 and made.settings["torch.is_grad_enabled()"] is False
        again = f.specialize(_x(3, seed=1))
        f(_x(3, seed=2))
    assert again.key == made.key and len(f.specializations) == 1
    assert f.specialization_uses()[0].calls == 1


def test_the_gate_refuses_settings_the_contract_cannot_judge() -> None:
    """Calls made with float32 matmul precision "high": judging them as IEEE float32 would
    need a specialization they never ran."""
    before = torch.get_float32_matmul_precision()
    model, compiled = linear_called_at_high_precision(_x(2, 8))
    report = plait.conformance.check(model, compiled, (_x(2, 8, seed=1),))
    assert report.caught("settings", "specialization"), report
    assert torch.get_float32_matmul_precision() == before
    assert len(compiled.specializations) == 1

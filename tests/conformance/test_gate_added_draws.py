"""The draws the gate adds so that every value outside the stress draw pools ``MIN_SAMPLES``
error samples (``plait.conformance.gate``): they go on while a value is short (a draw where the
value is not finite pools nothing), stop at a bound and say so, are checked as fresh as the
first draws, are judged like them (a miscompile is caught there), and leave values that pool
nothing (empty, integer, bool, all-NaN, data-dependent outputs) alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.conformance
from plait.conformance import check, gate
from plait.conformance.gate import MIN_SAMPLES
from tests.conformance.models import randn
from tests.util import linear_called_at_high_precision


def _log_sum(t: torch.Tensor) -> torch.Tensor:
    return torch.log(t.sum())


def _finite_where(finite: Callable[[int], bool], seeds: list[int]) -> Callable[[int], Any]:
    """Inputs whose sum is positive (``log`` finite) where ``finite(seed)``, negative (NaN)
    elsewhere; records each seed drawn."""

    def make(seed: int) -> tuple[torch.Tensor]:
        seeds.append(seed)
        t = randn(6, 5, seed=seed).abs() + 0.1
        return (t if finite(seed) else -t,)

    return make


def _pooled(report: plait.conformance.Report, where: str) -> int:
    (anchored,) = [a for k, a in report.anchored.items() if k.startswith(f"{where} (layout")]
    return anchored.draws


def test_draws_go_on_until_a_value_that_is_nan_on_some_draws_pools_enough() -> None:
    """A 0-d value finite on one draw in three: one round of added draws (sized as if each
    pooled a sample) left it at two samples."""
    seeds: list[int] = []
    report = check(_log_sum, _log_sum, _finite_where(lambda s: s % 3 == 1, seeds), draws=2)
    assert report.ok, str(report)
    assert _pooled(report, "output") >= MIN_SAMPLES, report.notes
    assert any("more draw(s) judged" in note for note in report.notes), report.notes


def test_added_draws_stop_at_their_bound_and_say_the_value_stayed_short() -> None:
    """A value finite on the first draw only: the gate does not draw forever."""
    seeds: list[int] = []
    report = check(_log_sum, _log_sum, _finite_where(lambda s: s == 1, seeds), draws=1)
    assert report.ok, str(report)
    # NOTE: draw 1, the stress and special-values draws, the added ones
    assert len(seeds) <= 3 + gate.MAX_ADDED_DRAWS, seeds
    assert _pooled(report, "output") == 1
    short = [n for n in report.notes if "after" in n and f"the {MIN_SAMPLES}" in n]
    assert short, report.notes


def test_added_draws_are_checked_as_fresh() -> None:
    """A factory that ignores its seed, with ``draws=1``: the added draws repeat draw 1, and
    pooling copies of one error sample is one sample, whatever the count says."""

    def same(seed: int) -> tuple[torch.Tensor]:
        return (randn(90, seed=0),)

    report = check(lambda t: t.mean(), lambda t: t.mean(), same, draws=1)
    assert report.caught("inputs", "setup"), str(report)


def _biased(compiled: Any, bias: float) -> None:
    """The compiled program's executor adds ``bias`` to the first element of its first output:
    a miscompile far below the elementwise budget, far above eager's rounding."""
    spec = compiled.specializations[0]
    run = spec.compiled.executor

    def wrong(*args: Any, **kwargs: Any) -> Any:
        out = run(*args, **kwargs)
        first = out[0] if isinstance(out, list | tuple) else out
        first.view(-1)[0] += bias
        return out

    spec.compiled.executor = wrong


@pytest.mark.parametrize("draws", [1, 3])
def test_a_biased_compiled_mean_is_caught(draws: int) -> None:
    def mean(t: torch.Tensor) -> torch.Tensor:
        return t.mean()

    compiled = plait.compile(mean, backend="stax", options={"cache": False})
    x = randn(90, seed=3)
    scale = float(x.abs().max())
    compiled(x)
    ok = check(mean, compiled, (x,), draws=draws)
    assert ok.ok, str(ok)
    _biased(compiled, 2**-15 * scale)
    report = check(mean, compiled, (x,), draws=draws)
    assert report.caught("output", "anchored"), str(report)


def test_one_draw_is_judged_with_the_added_ones() -> None:
    """``draws=1``: a candidate wrong on draw 1's inputs alone is caught there."""

    def factory(seed: int) -> tuple[torch.Tensor]:
        return (randn(90, seed=seed),)

    first = factory(1)[0]  # NOTE: draw 1 of gate seed 0

    def candidate(t: torch.Tensor) -> torch.Tensor:
        return t.mean() + float(torch.equal(t, first))

    report = check(lambda t: t.mean(), candidate, factory, draws=1)
    assert {f.case.split(",")[0] for f in report.errors} == {"draw 1"}, str(report)
    assert any("more draw(s) judged" in note for note in report.notes), report.notes


NO_SAMPLES: dict[str, Callable[[torch.Tensor], Any]] = {
    "empty": lambda t: t[:0] * 2,
    "integer": lambda t: (t > 0).sum(),
    "bool": lambda t: t > 0,
    "all_nan": lambda t: t.sum() * float("nan"),
}


def _recording(seeds: list[int]) -> Callable[[int], tuple[torch.Tensor]]:
    """A 6 x 5 draw per seed that records each seed asked for."""

    def factory(seed: int) -> tuple[torch.Tensor]:
        seeds.append(seed)
        return (randn(6, 5, seed=seed),)

    return factory


@pytest.mark.parametrize("name", sorted(NO_SAMPLES))
def test_values_that_pool_nothing_add_no_draws(name: str) -> None:
    fn = NO_SAMPLES[name]
    seeds: list[int] = []
    factory = _recording(seeds)
    report = check(fn, fn, factory, draws=1)
    assert report.ok, str(report)
    assert not [n for n in report.notes if "more draw(s)" in n], report.notes
    assert len(seeds) == 3, seeds  # NOTE: draw 1, the stress and the special-values draws


def test_a_refused_specialization_is_reported_once() -> None:
    """Calls made under float32 matmul precision "high": the gate refuses to judge them; the
    round of added draws (none here) must not report the refusal again."""
    model, compiled = linear_called_at_high_precision(randn(2, 8, seed=0))
    report = check(model, compiled, (randn(2, 8, seed=1),))
    refusals = [f for f in report.errors if f.check == "specialization"]
    assert len(refusals) == 1, str(report)


def test_a_data_dependent_output_of_few_elements_is_drawn_for_within_the_bound() -> None:
    """``t[t > 2]``: about one element in a draw, none in many; its size changes per draw."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        return t[t > 2.0] * 3.0

    seeds: list[int] = []
    factory = _recording(seeds)
    report = check(fn, fn, factory, draws=1)
    assert report.ok, str(report)
    assert len(seeds) <= 2 + gate.MAX_ADDED_DRAWS, seeds

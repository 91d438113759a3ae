"""How the gate runs programs: fresh draws, factories, repeated calls, module state, layouts,
devices, determinism, aliasing and the global state it must leave alone."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait.contract
from plait.conformance import check, draw_like
from plait.conformance.compare import identical
from tests.conformance.models import ConvBN, randn, seeded
from tests.conformance.mutants import race_nondeterminism, softmax_without_max

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class Recorder:
    """A correct candidate that remembers every input it was called with."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.seen: list[tuple[torch.Tensor, ...]] = []

    def __call__(self, *args: torch.Tensor) -> Any:
        self.seen.append(tuple(a.detach().clone() for a in args))
        return self.fn(*args)


def test_draws_are_fresh_never_zero_and_shaped_like_the_example() -> None:
    x = torch.zeros(4, 3)  # NOTE: even a zero example yields non-zero draws.
    idx = torch.tensor([0, 2, 5])
    mask = torch.tensor([True, False])
    for seed in range(3):
        dx, di, dm = draw_like((x, idx, mask), seed)
        assert dx.shape == x.shape and dx.dtype == x.dtype and bool(dx.ne(0).all())
        assert di.dtype == idx.dtype and int(di.min()) >= 0 and int(di.max()) <= 5
        assert dm.dtype == torch.bool and dm.shape == mask.shape
    positive = randn(50, seed=1).abs() + 0.1
    assert bool((draw_like((positive,), 0)[0] > 0).all())
    assert not torch.equal(draw_like((positive,), 0)[0], draw_like((positive,), 1)[0])


def test_candidate_sees_the_example_fresh_draws_and_repeated_calls() -> None:
    x = randn(4, 6, seed=2)
    cand = Recorder(lambda t: t * 3)
    assert check(lambda t: t * 3, cand, (x,), draws=3).ok
    distinct: list[torch.Tensor] = []
    for (seen,) in cand.seen:
        if not any(identical(seen, d) for d in distinct):
            distinct.append(seen)
    assert len(cand.seen) == 2 * len(distinct)  # NOTE: every case is called twice.
    # NOTE: the example, three fresh draws, the stress draw and the special-values draw
    assert len(distinct) == 6
    assert sum(bool(d.isnan().any()) for d in distinct) == 1
    assert any(torch.equal(d, x) for d in distinct)
    assert all(bool(d.ne(0).any()) for d in distinct)


def test_a_factory_gives_the_inputs() -> None:
    def factory(seed: int) -> tuple[torch.Tensor]:
        return (randn(5, seed=seed),)

    cand = Recorder(torch.sin)
    assert check(torch.sin, cand, factory, draws=4, stress=None).ok
    assert len(cand.seen) == 10  # NOTE: 4 draws and the special-values draw, each called twice


def test_a_factory_that_is_not_fresh_is_a_setup_error() -> None:
    report = check(torch.sin, torch.sin, lambda seed: (randn(5, seed=0),))
    assert report.caught("draw 2", "setup")
    zero = check(torch.sin, torch.sin, lambda seed: (torch.zeros(3) * seed,))
    assert zero.caught("input[0]", "setup")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="draws"):
        check(torch.sin, torch.sin, (randn(3, seed=3),), draws=0)
    with pytest.raises(ValueError, match="layout"):
        check(torch.sin, torch.sin, (randn(3, seed=3),), layouts=("nhwc",))
    with pytest.raises(plait.contract.ContractError, match="op class"):
        check(torch.sin, torch.sin, (randn(3, seed=3),), op_class="convolution")


def test_state_and_rng_are_left_as_found() -> None:
    model = seeded(2, ConvBN)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert check(model, model, (randn(4, 3, 8, 8, seed=4),), grads=True).ok
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())


def test_buffers_need_to_know_the_candidates_module() -> None:
    model = seeded(2, ConvBN)
    report = check(model, lambda x: model(x), (randn(4, 3, 8, 8, seed=5),))
    assert report.caught("buffers", "setup")


def test_buffer_names_align_through_a_wrapper() -> None:
    model = seeded(2, ConvBN)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    assert check(model, Wrapper(), (randn(4, 3, 8, 8, seed=6),), grads=True).ok


class TwoNorms(nn.Module):
    """Two BatchNorms whose state names end alike (``bn.running_mean``, ``block.bn.running_mean``),
    as in a ResNet: a suffix cannot tell them apart behind a wrapper's prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3)
        self.block = ConvBN()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.bn(x))


@pytest.mark.parametrize("wrap", ["torch.compile", "DataParallel"])
def test_state_names_align_through_wrapper_prefixes(wrap: str) -> None:
    # NOTE: torch.compile's OptimizedModule names the state `_orig_mod.bn.running_mean`,
    # DataParallel `module.bn.running_mean`; without candidate_module= the gate reads the wrapper.
    model = seeded(11, TwoNorms)
    if wrap == "torch.compile":
        compiled: Any = torch.compile(model, backend="eager", dynamic=False)
        wrapped: nn.Module = compiled
        prefix = "_orig_mod."
    else:
        wrapped, prefix = nn.DataParallel(model, device_ids=[]), "module."
    assert all(name.startswith(prefix) for name, _ in wrapped.named_buffers())
    report = check(model, wrapped, (randn(4, 3, 6, 6, seed=12),), grads=True, draws=1)
    assert report.ok, str(report)
    judged = {where.split(" (")[0] for where in report.anchored}
    assert {"buffer[bn.running_mean]", "buffer[block.bn.running_mean]"} <= judged
    assert "grad[bn.weight]" in judged and "grad[block.conv.weight]" in judged


def test_channels_last_is_run_when_asked_and_noted_when_impossible() -> None:
    model = seeded(2, ConvBN)
    report = check(
        model, model, (randn(2, 3, 5, 5, seed=7),), layouts=("contiguous", "channels_last")
    )
    assert report.ok and not [n for n in report.notes if not n.startswith("special-values")]
    flat = check(torch.sin, torch.sin, (randn(3, 4, seed=7),), layouts=("channels_last",))
    assert flat.ok and any("channels_last" in note for note in flat.notes)


def test_cuda_is_compared_where_it_exists_and_noted_where_not() -> None:
    model = seeded(2, ConvBN)
    report = check(model, model, (randn(2, 3, 5, 5, seed=8),), devices=("cpu", "cuda"))
    assert report.ok
    if not torch.cuda.is_available():
        assert any("cuda skipped" in note for note in report.notes)


def test_nondeterminism_is_judged_by_the_contract() -> None:
    setup = race_nondeterminism()
    assert not check(setup.reference, setup.candidate, setup.inputs, **setup.options).ok
    data = tomllib.loads(plait.contract.default_text())
    data["op"]["model"]["float32"]["nondeterministic"] = True
    data["changelog"].append(
        {"version": "test", "date": "2026-11-29", "reason": "test", "changes": ["op.*"]}
    )
    allowing = plait.contract.from_data(data)
    setup = race_nondeterminism()
    report = check(
        setup.reference, setup.candidate, setup.inputs, contract=allowing, **setup.options
    )
    assert report.ok, str(report)


def test_an_output_aliasing_an_input_must_alias_in_eager_too() -> None:
    x = randn(3, 3, seed=9)
    assert check(lambda t: t * 1, lambda t: t, (x,)).caught("output", "alias")
    view = check(lambda t: t[0], lambda t: t[0].clone(), (x,))
    assert view.ok and any(f.check == "alias" for f in view.warnings)


def test_the_stress_draw_is_what_exposes_an_unstable_softmax() -> None:
    setup = softmax_without_max()
    # NOTE: the special-values draw catches it too (an inf in a row: eager's softmax is NaN there)
    calm = check(
        setup.reference, setup.candidate, setup.inputs, stress=None, special_values=False,
        **setup.options,
    )  # fmt: skip
    assert calm.ok
    report = check(setup.reference, setup.candidate, setup.inputs, **setup.options)
    assert report.caught("stress draw", "nonfinite")


def test_eager_in_a_layout_that_draws_other_random_numbers_is_no_baseline() -> None:
    # NOTE: dropout on a channels_last tensor draws its mask in memory order: that eager run
    # computes another function, and must not widen the model rule's budget.
    model = seeded(3, lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Dropout(0.5)))
    report = check(model.train(), model, (randn(2, 3, 8, 8, seed=1),), grads=True)
    assert report.ok, str(report)
    assert any("layout channels_last is not a baseline" in note for note in report.notes)
    assert all(a.baseline_from == "eager" for a in report.anchored.values())


def test_dropout_sees_the_same_random_stream_in_both_programs() -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5)).train()
    assert check(model, model, (randn(4, 6, seed=10),), grads=True).ok


def _sums_in_turns(turn: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], torch.Tensor]:
    """Row sums of ``x @ x.T`` in chunks, the chunks' order reversed on the calls where
    ``turn(x)`` says so: a race's answer, as atomics accumulate."""

    def f(x: torch.Tensor) -> torch.Tensor:
        chunks = [x[:, k : k + 4] @ x[:, k : k + 4].T for k in range(0, x.shape[1], 4)]
        if turn(x):
            chunks.reverse()
        out = chunks[0]
        for c in chunks[1:]:
            out = out + c
        return out

    return f


def _every_other() -> Callable[[torch.Tensor], bool]:
    calls = [0]

    def turn(x: torch.Tensor) -> bool:
        calls[0] += 1
        return calls[0] % 2 == 0

    return turn


def _after_two_sightings() -> Callable[[torch.Tensor], bool]:
    """Reversed from the third call on one input: eager's two runs of a case agree, the
    runs made again differ."""
    seen: dict[bytes, int] = {}

    def turn(x: torch.Tensor) -> bool:
        key = x.detach().contiguous().numpy().tobytes()
        seen[key] = seen.get(key, 0) + 1
        return seen[key] > 2

    return turn


def test_a_candidates_differing_calls_make_eager_run_again_before_they_fail() -> None:
    x = randn(6, 32, seed=11)
    racing = check(_sums_in_turns(_after_two_sightings()), _sums_in_turns(_every_other()), (x,))
    assert racing.ok, str(racing)
    assert any("eager is itself nondeterministic" in note for note in racing.notes), racing
    # NOTE: eager that stays deterministic: the candidate's differing calls still fail
    steady = check(_sums_in_turns(lambda x: False), _sums_in_turns(_every_other()), (x,))
    assert steady.caught("output", "nondeterminism"), str(steady)

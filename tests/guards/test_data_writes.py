"""A write through ``tensor.data`` bumps no version counter of the tensor: a frozen parameter
so written recompiles (its sampled elements are guarded), and a caller's weight so written is
prepared again (its prepacked copy is compared by them). Every result is eager's."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.frontend import ModuleState
from plait.guards import GuardEnv, GuardSet
from plait.guards.native import EVALUATORS
from plait.guards.sampled import reading, take_sample, values_now
from plait.guards.state import StateFetcher, frozen_guards
from tests.util import contract_tol

NO_CACHE = {"cache": False}


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 8), nn.Linear(8, 8)
    ).eval()


def _clamp(m: nn.Module) -> None:
    for p in m.parameters():
        p.data.clamp_(-0.01, 0.01)  # NOTE: WGAN's weight clipping


def _scale(m: nn.Module) -> None:
    m[0].weight.data.mul_(1.5)


def _copy(m: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)  # NOTE: the same values into both models
    m[3].weight.data.copy_(torch.randn(m[3].weight.shape, generator=g))


def _transpose(m: nn.Module) -> None:
    m[4].weight.data = m[4].weight.data.t()  # NOTE: the same storage, other strides


def _negate(m: nn.Module) -> None:
    m[3].bias.data.neg_()  # NOTE: every sampled element's top bit flips


WRITES: list[Callable[[nn.Module], Any]] = [_clamp, _scale, _copy, _transpose, _negate]
IDS = ["clamp", "mul", "copy", "transpose", "negate"]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, **contract_tol("conv", torch.float32))


@pytest.mark.parametrize("write", WRITES, ids=IDS)
@pytest.mark.parametrize("freeze", [True, False], ids=["frozen", "inputs"])
def test_write_through_data_is_seen(write: Callable[[nn.Module], Any], freeze: bool) -> None:
    torch.manual_seed(0)
    model = _net()
    eager = copy.deepcopy(model)
    f = plait.compile(model, options={**NO_CACHE, "freeze": freeze})
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(4, 3, 8, 8)
            _close(f(x), eager(x))
        write(model)
        write(eager)
        for _ in range(2):
            x = torch.randn(4, 3, 8, 8)
            _close(f(x), eager(x))
    if freeze:
        assert len(f.specializations) == 2, f.recompile_reasons
        assert "sampled values" in f.recompile_reasons[0], f.recompile_reasons


def test_weight_argument_written_through_data_is_prepared_again() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.linear(F.conv2d(x, c).flatten(1), w)

    torch.manual_seed(0)
    w, c = torch.randn(5, 8 * 6 * 6), torch.randn(8, 3, 3, 3)
    f = plait.compile(fn, options=NO_CACHE)
    with torch.no_grad():
        for k in range(4):
            x = torch.randn(4, 3, 8, 8)
            _close(f(x, w, c), fn(x, w, c))
            w.data.mul_(1.5 + k)
            c.data.add_(torch.randn_like(c))


def _guarded(model: nn.Module, evaluators: Any) -> tuple[GuardSet, GuardEnv]:
    ms = ModuleState(model)
    fetch = StateFetcher(ms)
    state = fetch()
    guards = GuardSet(
        frozen_guards({e.path: i for i, e in enumerate(ms.entries)}, state), evaluators
    )
    return guards, GuardEnv((), [], model, fetch())


@pytest.mark.parametrize("write", WRITES, ids=IDS)
def test_native_and_python_evaluators_agree(write: Callable[[nn.Module], Any]) -> None:
    torch.manual_seed(0)
    model = _net()
    native, env = _guarded(model, EVALUATORS)
    python, _ = _guarded(model, None)
    assert native.holds(env) and python.holds(env)
    if native.evaluator != "native":
        pytest.skip(f"no native evaluator here: {native.evaluator}")
    write(model)
    assert not native.holds(env)
    assert not python.holds(env)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(7, 5),
        lambda: torch.randn(5, 7).t(),
        lambda: torch.randn(3, 4, dtype=torch.float64)[:, 1:],
        lambda: torch.randint(0, 100, (9,), dtype=torch.int16),
        lambda: torch.randn(6, dtype=torch.complex128),
        lambda: torch.randn(3),
    ],
    ids=["dense", "transposed", "sliced-f64", "int16", "complex128", "short"],
)
def test_sample_reads_what_it_took(make: Callable[[], torch.Tensor]) -> None:
    torch.manual_seed(0)
    t = make()
    s = take_sample(t)
    assert s is not None
    assert reading(t, s) == s.raw
    before = values_now(t)
    t.data.neg_()  # NOTE: every nonzero element changes, exactly back on the second
    assert reading(t, s) != s.raw
    assert values_now(t) != before
    t.data.neg_()
    assert reading(t, s) == s.raw
    assert values_now(t) == before


def test_sample_refuses_another_layout() -> None:
    w = torch.randn(6, 6)
    s = take_sample(w)
    assert s is not None
    w.data = w.data.t()
    assert reading(w, s) is None  # NOTE: the offsets are not read for other strides
    w.data = torch.randn(2)
    assert reading(w, s) is None
    assert take_sample(torch.randn(3, device="meta")) is None
    assert take_sample(torch.empty(0)) is None

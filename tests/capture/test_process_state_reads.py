"""State of the process a program reads through library calls: a draw from Python's or
NumPy's global random generator, or from a generator object the program holds, is the loud
eager fallback (a graph would hold the capture's draw as a constant, where eager draws again
on each call); the environment (``os.environ``, ``os.getenv``) is guarded by its contents. The
results equal eager's over successive calls from the same seed, and the generators end where
eager leaves them."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol

NO_CACHE = {"cache": False}


def _calls(fn: Callable[..., Any], seed: Callable[[], None], n: int = 4) -> list[Any]:
    seed()
    return [fn(torch.ones(3)) for _ in range(n)]


def _global_python(x: torch.Tensor) -> torch.Tensor:
    return x * random.uniform(0, 1)


def _global_numpy(x: torch.Tensor) -> torch.Tensor:
    return x * float(np.random.rand())


@pytest.mark.parametrize(
    ("program", "seed", "after"),
    [
        (_global_python, lambda: random.seed(3), random.random),
        (_global_numpy, lambda: np.random.seed(3), np.random.rand),
    ],
    ids=["python", "numpy"],
)
def test_a_draw_from_a_global_generator_runs_eagerly_with_a_warning(
    program: Callable[..., Any], seed: Callable[[], None], after: Callable[[], Any]
) -> None:
    want = _calls(program, seed)
    want_next = after()
    compiled = plait.compile(program, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="draws from"):
        got = _calls(compiled, seed)
    assert after() == want_next  # NOTE: the generator moved once a call, as eager's
    for g, w in zip(got, want):
        assert_bitwise(g, w)


class Held:
    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make
        self.rng = make()

    def step(self, x: torch.Tensor) -> torch.Tensor:
        rng = self.rng
        draw = rng.random() if isinstance(rng, (random.Random, np.random.Generator)) else rng.rand()
        return x * float(draw)


@pytest.mark.parametrize(
    "make",
    [
        lambda: random.Random(0),
        lambda: np.random.default_rng(0),
        lambda: np.random.RandomState(0),
    ],
    ids=["random.Random", "numpy Generator", "numpy RandomState"],
)
def test_a_draw_from_a_held_generator_runs_eagerly(make: Callable[[], Any]) -> None:
    eager, obj = Held(make), Held(make)
    compiled = plait.compile(obj.step, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning):
        got = [compiled(torch.ones(3)) for _ in range(3)]
    for g in got:
        assert_bitwise(g, eager.step(torch.ones(3)))


class LayerDrop(nn.Module):
    """A block skipped at random in training (the LayerDrop of older Hugging Face models)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.p = nn.Linear(8, 8), nn.Linear(8, 8), 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        if self.training and random.uniform(0, 1) < self.p:
            return x
        return self.second(x)


def test_layer_drop_compiled_in_eval_then_trained_draws_as_eager() -> None:
    model = LayerDrop().eval()
    compiled = plait.compile(model, options=NO_CACHE)
    with torch.no_grad():
        x = torch.randn(5, 8)
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("matmul", x.dtype))
        model.train()
        xs = [torch.randn(5, 8) for _ in range(6)]
        random.seed(5)
        want = [model(x) for x in xs]
        random.seed(5)
        with pytest.warns(CaptureFallbackWarning, match="draws from"):
            got = [compiled(x) for x in xs]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **contract_tol("matmul", w.dtype))


def _from_environment(x: torch.Tensor) -> torch.Tensor:
    return x * float(os.getenv("PLAIT_TEST_SCALE", "1"))


def _from_environ(x: torch.Tensor) -> torch.Tensor:
    return x * float(os.environ.get("PLAIT_TEST_SCALE", "1"))


@pytest.mark.parametrize("program", [_from_environment, _from_environ], ids=["getenv", "environ"])
def test_the_environment_read_is_guarded(
    program: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_TEST_SCALE", "2")
    compiled = plait.compile(program, options=NO_CACHE)
    for scale in ("2", "2", "3", None):
        if scale is None:
            monkeypatch.delenv("PLAIT_TEST_SCALE")
        else:
            monkeypatch.setenv("PLAIT_TEST_SCALE", scale)
        x = torch.randn(4, 4)
        assert_bitwise(compiled(x), program(x))
    assert len(compiled.specializations) == 3, compiled.recompile_reasons
    assert "os.environ" in compiled.recompile_reasons[0]


def test_a_program_that_draws_nothing_is_compiled() -> None:
    compiled = plait.compile(lambda x: x.relu() * 2, options=NO_CACHE)
    compiled(torch.randn(3))
    assert compiled.specializations[0].fallback_reason is None

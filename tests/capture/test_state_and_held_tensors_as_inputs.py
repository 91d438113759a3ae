"""An input tensor that is also a tensor the program reaches another way, as in eager.

Capture traced each input through a tracer of its own, so a module called with its own parameter
or buffer (``m(m.weight)``) saw ``x is self.weight`` read False, and a program called with a
tensor it also reads from Python state (``f(G)`` for a global ``G``) saw ``x is G`` read False:
both ran the other branch, silently. Now an input that is the module's parameter or buffer is
traced as that state tensor (a write through either name is one write), and an input the program
also reads from Python state is refused (the loud eager fallback, with its reason). Both are
guarded: a call passing another pattern compiles again."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.cache.helpers import status
from tests.util import contract_tol

TOL = contract_tol("pointwise", torch.float32)
HELD = torch.randn(5, 3)


class BranchOnWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 3))
        self.register_buffer("shift", torch.randn(5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x is self.weight:
            return x * 3.0 + self.shift
        if x is self.shift:
            return x.sin() - self.weight
        return x * self.weight - 1.0


class WritesThroughInput(nn.Module):
    """Eager's ``x.add_(1)`` on ``m(m.count)`` updates the buffer the program then reads."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.randn(4, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return self.count * 2.0 + x


def branch_on_held(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 if x is HELD else x - 1.0


def _fresh(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("first", ["weight", "shift", "fresh"])
def test_module_called_with_its_own_state_matches_eager(first: str) -> None:
    model = BranchOnWeight()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    kinds = ["weight", "shift", "fresh"]
    order = [first, *[k for k in kinds if k != first]] * 2
    with torch.no_grad():
        for k, kind in enumerate(order):
            x = {"weight": model.weight, "shift": model.shift}.get(kind)
            x = _fresh(5, 3, seed=k) if x is None else x
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert len(compiled.specializations) == 3
    assert not any(s.fallback_reason for s in compiled.specializations)


def test_state_input_recompile_names_the_parameter() -> None:
    model = BranchOnWeight()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    with torch.no_grad():
        compiled(_fresh(5, 3, seed=1))
        compiled(model.weight)
    reasons = " ".join(str(r) for r in compiled.recompile_reasons)
    assert "x is weight" in reasons, reasons


def test_write_through_an_input_that_is_a_buffer_is_one_write() -> None:
    model, reference = WritesThroughInput(), WritesThroughInput()
    reference.count.copy_(model.count)
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    for _ in range(3):
        got, want = compiled(model.count), reference(reference.count)
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(model.count, reference.count, **TOL)
    assert not any(s.fallback_reason for s in compiled.specializations)
    x = _fresh(4, 2, seed=7)
    torch.testing.assert_close(compiled(x.clone()), reference(x.clone()), **TOL)
    torch.testing.assert_close(model.count, reference.count, **TOL)


def test_gradient_through_a_parameter_passed_as_input_matches_eager() -> None:
    """``(x * self.weight).sum()`` on ``m(m.weight)``: the gradient is ``2 * weight``."""

    class Square(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(6, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * self.weight).tanh().sum()

    model = Square()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    compiled(model.weight).backward()
    got = model.weight.grad.clone()
    model.weight.grad = None
    model(model.weight).backward()
    torch.testing.assert_close(got, model.weight.grad, **contract_tol("reduction", torch.float32))


def test_write_through_a_repeated_input_compiles_as_one_write() -> None:
    """``f(x, x)`` writing ``a``: eager's ``b`` sees the write (one tensor); no fallback."""

    def double_then_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(2.0)
        return a + b

    compiled = plait.compile(double_then_add, backend="stax", options={"cache": False})
    for k in range(2):
        x = _fresh(3, 5, seed=20 + k)
        mine, theirs = x.clone(), x.clone()
        torch.testing.assert_close(compiled(mine, mine), double_then_add(theirs, theirs), **TOL)
        torch.testing.assert_close(mine, theirs, **TOL)
    assert not any(s.fallback_reason for s in compiled.specializations)


def test_input_held_in_python_state_is_refused_and_guarded() -> None:
    compiled = plait.compile(branch_on_held, backend="stax", options={"cache": False})
    x = _fresh(5, 3, seed=30)
    torch.testing.assert_close(compiled(x), branch_on_held(x), **TOL)
    with pytest.warns(CaptureFallbackWarning, match="Python state"):
        torch.testing.assert_close(compiled(HELD), branch_on_held(HELD), **TOL)
    y = _fresh(5, 3, seed=31)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        torch.testing.assert_close(compiled(y), branch_on_held(y), **TOL)
        torch.testing.assert_close(compiled(HELD), branch_on_held(HELD), **TOL)
    reasons = " ".join(str(r) for r in compiled.recompile_reasons)
    assert "the program reads from Python state" in reasons, reasons


def test_input_read_as_a_constant_too_is_refused() -> None:
    def add_held(x: torch.Tensor) -> torch.Tensor:
        return x + HELD

    compiled = plait.compile(add_held, backend="stax", options={"cache": False})
    with pytest.warns(CaptureFallbackWarning, match="also"):
        torch.testing.assert_close(compiled(HELD), add_held(HELD), **TOL)
    x = _fresh(5, 3, seed=40)
    torch.testing.assert_close(compiled(x), add_held(x), **TOL)


def test_saved_program_of_a_state_input_is_not_taken_for_a_fresh_tensor(tmp_path: Path) -> None:
    options = {"cache": str(tmp_path)}
    model = BranchOnWeight()
    with torch.no_grad():
        cold = plait.compile(model, backend="stax", options=options)
        torch.testing.assert_close(cold(model.weight), model(model.weight), **TOL)
        assert status(cold.specializations[-1]) == "miss"
        warm = plait.compile(model, backend="stax", options=options)
        x = _fresh(5, 3, seed=50)
        torch.testing.assert_close(warm(x), model(x), **TOL)
        torch.testing.assert_close(warm(model.weight), model(model.weight), **TOL)
    assert [status(s) for s in warm.specializations] == ["miss", "hit"]


def test_native_identity_check_agrees_with_the_python_read() -> None:
    """Each specialization's guards, natively and in Python, on every kind of call."""
    from plait.guards import native
    from plait.guards.guard import GuardEnv

    model = BranchOnWeight()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    calls = {"weight": model.weight, "shift": model.shift, "fresh": _fresh(5, 3, seed=60)}
    with torch.no_grad():
        for x in calls.values():
            compiled(x)
    engine = compiled._plait
    for spec in compiled.specializations:
        if native.status().available:
            assert spec.guards.evaluator == "native"
        held = []
        for x in [*calls.values(), _fresh(5, 3, seed=61)]:
            spec_, leaves, _ = engine.adapter.flatten((x,), {})
            env = GuardEnv(spec_, leaves, model, engine.fetch())
            with torch.no_grad():
                fast, slow = spec.guards.holds(env), spec.guards.holds_python(env)
            assert fast == slow, spec.guards.explain(env)
            held.append(fast)
        # NOTE: weight, shift, fresh, another fresh: each holds for its own kind alone
        assert sum(held[:3]) == 1 and held[3] == held[2]

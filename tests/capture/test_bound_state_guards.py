"""What a compiled callable holds besides its code is guarded: the object a compiled method is
bound to (``plait.compile(obj.step)``), a compiled object with ``__call__``, the positional
arguments a compiled ``functools.partial`` fixes, and the class a classmethod is bound to. Its
code reads them through a local name (``self.k``), which no global, closure cell or module
attribute read sees: a change after the first call recompiles (the reason names it), the
result equals eager's on fresh inputs, and a change the program makes while it runs is the
loud eager fallback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

NO_CACHE = {"cache": False}


def _x() -> torch.Tensor:
    return torch.randn(5, 8)


def _close(compiled: Any, eager: Callable[..., Any]) -> None:
    x = _x()
    with torch.no_grad():
        want, got = eager(x), compiled(x)
    torch.testing.assert_close(got, want, **contract_tol("matmul", want.dtype))


def _changed_once(compiled: Any, eager: Callable[..., Any], change: Callable[[], None]) -> None:
    _close(compiled, eager)
    _close(compiled, eager)
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    change()
    for _ in range(3):
        _close(compiled, eager)
    assert len(compiled.specializations) == 2, compiled.recompile_reasons


class Holder:
    def __init__(self) -> None:
        self.k = 1.0
        self.ks = [1.0, 2.0]
        self.lin = nn.Linear(8, 8)
        self.t = torch.ones(8)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.k * self.ks[1] + self.t

    def scale(self) -> float:
        return self.k

    def via_method(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(x)


CHANGES: dict[str, Callable[[Holder], None]] = {
    "float": lambda h: setattr(h, "k", 3.0),
    "list item": lambda h: h.ks.__setitem__(1, 5.0),
    "submodule": lambda h: setattr(h, "lin", nn.Linear(8, 8)),
    "tensor rebound": lambda h: setattr(h, "t", torch.randn(8)),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_of_the_object_a_compiled_method_is_bound_to_recompiles(change: str) -> None:
    h = Holder()
    compiled = plait.compile(h.step, options=NO_CACHE)
    _changed_once(compiled, h.step, lambda: CHANGES[change](h))
    assert "the object the compiled method step is bound to" in compiled.recompile_reasons[0]


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_of_a_compiled_callable_object_recompiles(change: str) -> None:
    h = Holder()
    compiled = plait.compile(h, options=NO_CACHE)
    _changed_once(compiled, h, lambda: CHANGES[change](h))


def test_an_attribute_read_in_a_method_the_compiled_method_calls_is_guarded() -> None:
    h = Holder()
    compiled = plait.compile(h.via_method, options=NO_CACHE)
    _changed_once(compiled, h.via_method, lambda: setattr(h, "k", 4.0))


def test_a_partials_fixed_object_argument_is_guarded() -> None:
    h = Holder()

    def scaled(holder: Holder, x: torch.Tensor) -> torch.Tensor:
        return x * holder.k

    program = functools.partial(scaled, h)
    compiled = plait.compile(program, options=NO_CACHE)
    _changed_once(compiled, program, lambda: setattr(h, "k", 4.0))


def test_a_partial_of_a_bound_method_guards_the_object() -> None:
    h = Holder()
    program = functools.partial(Holder.step, h)
    compiled = plait.compile(functools.partial(h.step), options=NO_CACHE)
    _changed_once(compiled, program, lambda: setattr(h, "k", 4.0))


class WithClassScale:
    k = 1.0

    @classmethod
    def step(cls, x: torch.Tensor) -> torch.Tensor:
        return x * cls.k


def test_a_classmethods_class_attribute_is_guarded() -> None:
    compiled = plait.compile(WithClassScale.step, options=NO_CACHE)
    try:
        _changed_once(compiled, WithClassScale.step, lambda: setattr(WithClassScale, "k", 4.0))
    finally:
        WithClassScale.k = 1.0


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.calls


def test_a_method_that_changes_its_object_runs_eagerly_with_a_warning() -> None:
    eager, obj = Counting(), Counting()
    compiled = plait.compile(obj.step, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="bound to"):
        first = compiled(torch.ones(3))
    outs = [first] + [compiled(torch.ones(3)) for _ in range(2)]
    want = [eager.step(torch.ones(3)) for _ in range(3)]
    for got, w in zip(outs, want):
        torch.testing.assert_close(got, w, **contract_tol("pointwise", w.dtype))
    assert obj.calls == eager.calls == 3


def test_a_bound_method_of_a_module_adds_no_root() -> None:
    """A module's attribute reads are recorded where they happen: its compiled method's guard
    is as before (and a warm start still finds it)."""
    from plait.frontend.bound_state import bound_roots

    lin = nn.Linear(2, 2)
    assert bound_roots(lin.forward) == []
    assert bound_roots(functools.partial(torch.mul, other=2.0)) == []
    assert bound_roots(functools.partial(lambda t, x: x * t, torch.ones(2))) == []

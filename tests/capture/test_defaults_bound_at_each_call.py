"""A compiled callable binds each call to its target's signature as it is at that call: defaults
rebound or changed in place after compiling, a ``functools.partial``'s keywords, a module's
``forward`` replaced. Eager Python reads them at each call; a signature read once at compile time
applied the old default on every later call (a silently wrong result)."""

from __future__ import annotations

import functools

import torch

import plait
from tests.util import contract_tol

TOL = contract_tol("pointwise", torch.float32)


def _agree(compiled, eager, calls: int = 2) -> None:
    for _ in range(calls):
        x = torch.randn(4, 5)
        torch.testing.assert_close(compiled(x), eager(x), **TOL)


def _scale(x: torch.Tensor, s: float = 1.5) -> torch.Tensor:
    return x * s + 1.0


def test_positional_defaults_rebound_after_compiling() -> None:
    def fn(x: torch.Tensor, s: float = 1.5) -> torch.Tensor:
        return x * s + 1.0

    compiled = plait.compile(fn)
    _agree(compiled, fn)
    fn.__defaults__ = (-2.25,)
    _agree(compiled, fn)


def test_keyword_only_default_changed_in_place() -> None:
    def fn(x: torch.Tensor, *, s: float = 0.5) -> torch.Tensor:
        return x * s - 1.0

    compiled = plait.compile(fn)
    _agree(compiled, fn)
    assert fn.__kwdefaults__ is not None
    fn.__kwdefaults__["s"] = 3.0
    _agree(compiled, fn)
    fn.__kwdefaults__ = {"s": -0.75}
    _agree(compiled, fn)


def test_partial_keywords_changed_in_place() -> None:
    part = functools.partial(_scale, s=2.0)
    compiled = plait.compile(part)
    _agree(compiled, part)
    part.keywords["s"] = -4.0
    _agree(compiled, part)


def test_module_forward_replaced_with_other_defaults() -> None:
    class Scaled(torch.nn.Module):
        def forward(self, x: torch.Tensor, s: float = 2.0) -> torch.Tensor:
            return x * s

    module = Scaled()
    compiled = plait.compile(module)
    _agree(compiled, module)
    module.forward = lambda x, s=-3.0: x * s + 0.5  # type: ignore[method-assign]
    _agree(compiled, module)


def test_unchanged_defaults_keep_one_specialization() -> None:
    def fn(x: torch.Tensor, s: float = 1.25) -> torch.Tensor:
        return x * s

    compiled = plait.compile(fn)
    _agree(compiled, fn, calls=3)
    assert len(compiled.specializations) == 1

"""A compiled module's forward hooks (its own and the global ones) see its call as the caller
made it: a keyword argument in ``kwargs``, never moved among the positional ones, and a default
the caller did not pass in neither. A forward pre-hook replaces the positional arguments only,
so an argument passed by keyword survives it, as in eager (it used to be passed on by position
and be dropped: ``compiled(x, scale=3.0)`` ran ``forward(hooked_x)`` with the default scale)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import plait
from tests.util import contract_tol


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, a: float = 1.0, b: float = 0.0) -> torch.Tensor:
        return self.lin(x) * a + b


def _x(seed: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))


def _form(args: tuple, kwargs: dict) -> float:
    """A number that tells the call's form apart: how many arguments came by position, and
    the names that came by keyword."""
    return len(args) + sum(10.0 * (1 + "ab".index(k)) for k in kwargs)


# NOTE: the ways to call _Scaled; each hook's result depends on how the call was made
CALLS: list[tuple[tuple, dict]] = [
    ((), {}),
    ((2.0,), {}),
    ((), {"a": 3.0}),
    ((), {"b": 0.5}),
    ((2.0,), {"b": 0.5}),
    ((1.0,), {}),  # NOTE: the default's own value, passed by position
    ((), {"a": 1.0, "b": 0.0}),  # NOTE: the defaults' values, passed by keyword
]

HOOKS: dict[str, Callable[[nn.Module], Any]] = {
    # NOTE: replaces the positional arguments: eager keeps the keyword ones
    "pre": lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,)),
    "pre_kwargs": lambda m: m.register_forward_pre_hook(
        lambda mod, args, kwargs: ((args[0] + _form(args, kwargs), *args[1:]), kwargs),
        with_kwargs=True,
    ),
    "forward_kwargs": lambda m: m.register_forward_hook(
        lambda mod, args, kwargs, out: out * _form(args, kwargs), with_kwargs=True
    ),
    "forward": lambda m: m.register_forward_hook(lambda mod, args, out: out + len(args)),
}


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_module_hooks_see_each_call_as_made(hook: str, fullgraph: bool) -> None:
    model = _Scaled()
    handle = HOOKS[hook](model)
    compiled = plait.compile(model, fullgraph=fullgraph, options={"recompile_limit": 32})
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("error")  # NOTE: captured, never the eager fallback
            for seed, (args, kwargs) in enumerate(CALLS * 2):
                x = _x(seed)
                got, want = compiled(x, *args, **kwargs), model(x, *args, **kwargs)
                torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
    finally:
        handle.remove()


def test_a_hook_registered_after_compiling_sees_the_keywords() -> None:
    model = _Scaled()
    compiled = plait.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(_x(0), b=0.5), model(_x(0), b=0.5), **contract_tol("model", torch.float32)
        )
        handle = HOOKS["pre"](model)
        try:
            for seed in (1, 2):
                got, want = compiled(_x(seed), b=0.5), model(_x(seed), b=0.5)
                torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
        finally:
            handle.remove()
        got, want = compiled(_x(3), b=0.5), model(_x(3), b=0.5)
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))


def test_global_forward_hooks_see_the_call_as_made() -> None:
    def pre(mod: nn.Module, args: tuple) -> Any:
        # NOTE: global pre-hooks take no kwargs: they replace the positional arguments only
        return (args[0] * 2 + len(args),) if isinstance(mod, _Scaled) else None

    def post(mod: nn.Module, args: tuple, kwargs: dict, out: torch.Tensor) -> Any:
        return out - _form(args, kwargs) if isinstance(mod, _Scaled) else None

    model = _Scaled()
    compiled = plait.compile(model, options={"recompile_limit": 32})
    handles = [
        nn_module.register_module_forward_pre_hook(pre),
        nn_module.register_module_forward_hook(post, with_kwargs=True),
    ]
    try:
        with torch.no_grad():
            for seed, (args, kwargs) in enumerate(CALLS):
                x = _x(seed)
                got, want = compiled(x, *args, **kwargs), model(x, *args, **kwargs)
                torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
    finally:
        for h in handles:
            h.remove()
            # NOTE: PyTorch's handle leaves its with_kwargs flag behind (a table plait reads)
            nn_module._global_forward_hooks_with_kwargs.pop(h.id, None)


def test_training_through_a_keyword_and_a_pre_hook() -> None:
    model = _Scaled()
    reference = _Scaled()
    reference.load_state_dict(model.state_dict())
    for m in (model, reference):
        HOOKS["pre"](m)
    compiled = plait.compile(model)
    for seed in (0, 1):
        x = _x(seed)
        got, want = compiled(x, a=3.0), reference(x, a=3.0)
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
        got.square().sum().backward()
        want.square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            assert p.grad is not None and q.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, **contract_tol("model", torch.float32))
            p.grad, q.grad = None, None

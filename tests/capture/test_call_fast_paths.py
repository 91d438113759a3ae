"""A call's fast paths give what the general paths give: a call of positional plain tensors
reuses the last such call's structure only while it is the same (defaults, hooks, signature),
the graph inputs are gathered in slot order, and fresh outputs never come back as an input."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.errors import InternalValueError
from plait.frontend.program import InputGather, InputSlot
from tests.util import assert_bitwise, contract_tol

TOL = contract_tol("pointwise", torch.float32)


def test_a_list_default_changed_in_place_is_seen() -> None:
    def fn(x: torch.Tensor, scale: list = [1.5]) -> torch.Tensor:  # noqa: B006
        return x * scale[0] + 1.0

    compiled = plait.compile(fn)
    for value in (1.5, -2.0, 0.25):
        fn.__defaults__[0][0] = value  # type: ignore[index]
        for _ in range(2):
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), fn(x), **TOL)


def test_a_forward_hook_added_between_positional_calls_is_seen() -> None:
    class Shift(torch.nn.Module):
        def forward(self, x: torch.Tensor, k: float = 2.0) -> torch.Tensor:
            return x * k

    model = Shift()
    compiled = plait.compile(model)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), model(x), **TOL)
    seen: list[tuple] = []

    def pre(module: torch.nn.Module, args: tuple) -> tuple:
        seen.append(args)
        return (args[0] + 1.0,)

    handle = model.register_forward_pre_hook(pre)
    try:
        for _ in range(2):
            x = torch.randn(5)
            got = compiled(x)
            torch.testing.assert_close(got, model(x), **TOL)
    finally:
        handle.remove()
    # NOTE: the capture's calls of the hook too: the call as made, the default not passed
    assert seen and all(len(args) == 1 for args in seen)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), model(x), **TOL)


def test_a_different_count_of_positional_tensors_binds_again() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2.0 if y is None else x - y

    compiled = plait.compile(fn)
    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(compiled(x), fn(x), **TOL)
    torch.testing.assert_close(compiled(x, y), fn(x, y), **TOL)
    torch.testing.assert_close(compiled(x), fn(x), **TOL)


def test_fresh_outputs_are_never_an_input_or_each_other() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(x.clone() for _ in range(7))  # NOTE: more than a scan's few questions

    compiled = plait.compile(fn)
    for _ in range(2):
        x = torch.randn(6)
        outs = compiled(x)
        assert len(outs) == 7
        pointers = {o.untyped_storage().data_ptr() for o in outs}
        assert len(pointers) == 7 and x.untyped_storage().data_ptr() not in pointers
        for o in outs:
            assert_bitwise(o, x)


def test_the_gather_follows_the_slots_order() -> None:
    const = torch.randn(2)
    slots = [
        InputSlot("state", 2),
        InputSlot("user", 1),
        InputSlot("const", const),
        InputSlot("state", 0),
        InputSlot("user", 0),
    ]
    leaves, state = ["a", "b"], ["s0", "s1", "s2"]
    got = InputGather(slots)(leaves, state)
    assert got[:2] == ["s2", "b"] and got[2] is const and got[3:] == ["s0", "a"]
    assert InputGather([InputSlot("user", 0)])(["only"], []) == ["only"]
    assert InputGather([])(["x"], ["y"]) == []


def test_the_gather_refuses_a_short_call() -> None:
    gather = InputGather([InputSlot("user", 0), InputSlot("state", 3)])
    with pytest.raises(InternalValueError, match="4 state entries"):
        gather(["x"], ["s0", "s1"])

"""A program that writes an input (or a buffer) and returns, or writes into another input, that
input's value from before the write: ``out = x.clone(); x.add_(1); return out``, a swap of two
inputs or buffers. The graph passes the old value through as the input itself, and the call's
write-back, which copies the written values into the inputs, changed it before it was returned
or copied: the output, or the other input, read the value after the write. Results against
eager on fresh inputs, several calls each, in inference and with grad enabled, everything
compared bit for bit (inputs and buffers after the call too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from tests.util import assert_bitwise


def _returns_clone_then_writes(a: torch.Tensor) -> torch.Tensor:
    out = a.clone()
    a.add_(1.0)
    return out


def _returns_old_and_new(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    old = a.clone()
    a.copy_(b)
    return old, a


def _swaps(a: torch.Tensor, b: torch.Tensor) -> None:
    t = a.clone()
    a.copy_(b)
    b.copy_(t)


def _rotates(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    t = a.clone()
    a.copy_(b)
    b.copy_(c)
    c.copy_(t)


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


class SwapsBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(4, generator=torch.Generator().manual_seed(7)))
        self.register_buffer("b", torch.randn(4, generator=torch.Generator().manual_seed(8)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.a.clone()
        self.a.copy_(self.b)
        self.b.copy_(t)
        return x + self.a


class TradesWithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(4, generator=torch.Generator().manual_seed(9)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        old = self.a.clone()
        self.a.copy_(x)
        x.copy_(old)
        return old


CASES: dict[str, tuple[Callable[[], nn.Module], int]] = {
    "returns_clone_then_writes": (lambda: Fn(_returns_clone_then_writes), 1),
    "returns_old_and_new": (lambda: Fn(_returns_old_and_new), 2),
    "swaps_inputs": (lambda: Fn(_swaps), 2),
    "rotates_inputs": (lambda: Fn(_rotates), 3),
    "swaps_buffers": (SwapsBuffers, 1),
    "trades_with_buffer": (TradesWithBuffer, 1),
}


def _inputs(seed: int, n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(4, generator=gen) for _ in range(n)]


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _flat(y)]
    return [] if x is None else [x]


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_value_from_before_a_write_comes_back_as_eager_gives_it(name: str, grad: bool) -> None:
    make, n = CASES[name]
    eager, model = make().eval(), make().eval()
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    for seed in range(3):
        got_in, want_in = _inputs(seed, n), _inputs(seed, n)
        with torch.set_grad_enabled(grad):
            got = compiled(*got_in)
            want = eager(*want_in)
        for k, (a, b) in enumerate(zip(_flat(got), _flat(want), strict=True)):
            assert_bitwise(a, b, f"{name} call {seed}: output {k}")
        for k, (a, b) in enumerate(zip(got_in, want_in)):
            assert_bitwise(a, b, f"{name} call {seed}: input {k} after the call")
        for (key, a), b in zip(model.named_buffers(), eager.buffers()):
            assert_bitwise(a, b, f"{name} call {seed}: buffer {key} after the call")
    assert compiled.specializations[0].executor is not None

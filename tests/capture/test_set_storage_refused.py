"""``Tensor.set_`` inside a captured program: PyTorch runs it without a torch function, so capture
never saw it. ``x.set_(y)`` on an input, a parameter, a buffer or a tensor the program made gave
the traced tensor other memory and another shape behind capture's back: the graph read the old
value, the caller's tensor kept its own, and the answer differed from eager without a word;
``G.set_(y)`` on a global made it share a capture sample's memory once, never again on later
calls. Such a program is refused loudly (eager runs it, warned; ``fullgraph=True`` raises), and
a later call answers as eager."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_bitwise

G: dict[str, torch.Tensor] = {}


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return self.fn(x, y)


def _input_set(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.set_(y)
    return x + 1.0


def _input_set_unread(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.set_(y)
    return y * 2.0


def _made_set(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = x * 2.0
    z.set_(y)
    return z + 1.0


def _global_set(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    G["t"].set_(y)
    return G["t"] * 2.0


class BufferSet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.zeros(2))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.b.set_(y)
        return x * 2.0


CASES: dict[str, Callable[[], nn.Module]] = {
    "input": lambda: Fn(_input_set),
    "input_unread": lambda: Fn(_input_set_unread),
    "made": lambda: Fn(_made_set),
    "global": lambda: Fn(_global_set),
    "buffer": BufferSet,
}


def _run(model: nn.Module, fn: Any, seed: int) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, 3, generator=gen), torch.randn(3, generator=gen)
    with torch.no_grad():
        out = fn(x, y)
    return out, x, *model.buffers(), G["t"]


@pytest.mark.parametrize("name", list(CASES))
def test_set_is_refused_loudly_and_answers_as_eager(name: str) -> None:
    eager, model = CASES[name](), CASES[name]()
    compiled = plait.compile(model, options={"cache": False})
    g_eager, g_compiled = torch.zeros(2), torch.zeros(2)
    for seed in range(3):
        G["t"] = g_compiled
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = _run(model, compiled, seed)
        G["t"] = g_eager
        want = _run(eager, eager, seed)
        g_compiled = got[-1]
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_bitwise(a, b, f"{name} call {seed}: item {k}")
        if seed == 0:
            assert any(issubclass(w.category, CaptureFallbackWarning) for w in caught)
    G["t"] = torch.zeros(2)
    with pytest.raises(GraphCaptureError, match=r"Tensor\.set_"):
        _run(model, plait.compile(model, fullgraph=True, options={"cache": False}), 0)


def test_set_outside_capture_is_pytorchs_own() -> None:
    """After a capture, and on a thread of its own, ``set_`` is PyTorch's."""
    compiled = plait.compile(Fn(_input_set), options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        _run(Fn(_input_set), compiled, 0)
    t = torch.zeros(2)
    t.set_(torch.ones(3))
    assert t.shape == (3,)
    done: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: done.append(torch.zeros(1).set_(torch.ones(4))))
    worker.start()
    worker.join()
    assert done[0].shape == (4,)

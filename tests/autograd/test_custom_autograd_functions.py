"""A user's ``torch.autograd.Function`` inside a compiled program: its backward (a gradient
reversal, a straight-through estimator) is its author's, not the derivative of its forward.
Capture records the forward's ops only, so where a gradient flows through one the call is a
recorded fallback (eager autograd runs the author's backward), and ``fullgraph=True`` refuses
it; where none flows (grad mode off, nothing requiring grad) the forward is captured."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import contract_tol


class _Reverse(torch.autograd.Function):
    """Gradient reversal: the identity forward (a view), the gradient negated and halved."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return -0.5 * g


class _Same(torch.autograd.Function):
    """Returns its input itself (PyTorch makes the output a view of it, no op of the user)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return 3.0 * g


class _RoundStraightThrough(torch.autograd.Function):
    """A straight-through estimator in the ``setup_context`` style: rounds to a grid of
    ``step``, passes the gradient through scaled by ``scale``."""

    @staticmethod
    def forward(x: torch.Tensor, step: float, scale: float) -> torch.Tensor:
        return torch.round(x / step) * step

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.scale = inputs[2]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return g * ctx.scale, None, None


_FUNCTIONS = {
    "reverse": lambda h: _Reverse.apply(h),
    "same": lambda h: _Same.apply(h),
    "straight-through": lambda h: _RoundStraightThrough.apply(h, 0.25, 2.0),
}


class _Net(nn.Module):
    def __init__(self, fn: str) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(_FUNCTIONS[self.fn](self.a(x))))


@pytest.mark.parametrize("fn", sorted(_FUNCTIONS))
def test_sgd_steps_through_a_custom_function_use_its_backward(fn: str) -> None:
    torch.manual_seed(0)
    model = _Net(fn)
    eager = copy.deepcopy(model)
    compiled = plait.compile(model, backend="stax")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    tol = contract_tol("model", torch.float32)
    for step in range(3):
        x = torch.randn(5, 8, generator=gen)
        for m, o in ((compiled, opt), (eager, opt_eager)):
            o.zero_grad(set_to_none=True)
            first = m is compiled and step == 0
            warned = pytest.warns(CaptureFallbackWarning, match="autograd.Function")
            with warned if first else contextlib.nullcontext():
                m(x).square().mean().backward()
            o.step()
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            assert q.grad is not None and p.grad is not None
            torch.testing.assert_close(
                q.grad, p.grad, **tol, msg=lambda m, n=name, s=step: f"{n}.grad step {s}: {m}"
            )
            torch.testing.assert_close(q, p, **tol)
    reasons = [f["reason"] for s in compiled.specializations for f in s.compiled.manifest.fallbacks]
    assert any("torch.autograd.Function" in r for r in reasons), reasons


def test_fullgraph_refuses_a_gradient_through_a_custom_function() -> None:
    compiled = plait.compile(_Net("reverse"), backend="stax", fullgraph=True)
    with pytest.raises(GraphCaptureError, match=r"torch\.autograd\.Function.*backward"):
        compiled(torch.randn(5, 8))


@pytest.mark.parametrize("fn", sorted(_FUNCTIONS))
def test_a_custom_function_without_gradients_is_captured(fn: str) -> None:
    """Under ``torch.no_grad()`` only the forward matters: captured, eager's values."""
    torch.manual_seed(2)
    model = _Net(fn)
    compiled = plait.compile(copy.deepcopy(model), backend="stax", fullgraph=True)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(5, 8, generator=gen)
            torch.testing.assert_close(
                compiled(x), model(x), **contract_tol("model", torch.float32)
            )

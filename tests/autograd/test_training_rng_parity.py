"""Training through a compiled program keeps eager's random numbers: the same seed before the
call gives the same draws, and the generator ends where eager's call leaves it (a ``torch.rand``
after the call gives eager's number), call after call.

The forward half of a training program used to keep only what its outputs and saved values
read, so a ``manual_seed``, a ``fork_rng``'s saved state or a draw that nothing reads was
dropped: every later draw, and the generator after the call, differed from eager's without a
word (inference kept them). And a parameter that reaches the output only through a draw whose
eager gradient is zeros (``torch.bernoulli(p)``, ``torch.normal(mean, std)``) got no gradient
(None) where eager's is zeros: an optimizer with momentum or weight decay steps on zeros, and
skips a None."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from tests.util import assert_bitwise, assert_grads_match_and_clear, contract_tol


def _seeded(x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(7)
    return x + torch.rand(x.shape[-1])


def _forked(x: torch.Tensor) -> torch.Tensor:
    with torch.random.fork_rng():
        inside = torch.rand(x.shape[-1])
    return x + inside + torch.rand(x.shape[-1])


def _restored(x: torch.Tensor) -> torch.Tensor:
    state = torch.get_rng_state()
    first = torch.rand(x.shape[-1])
    torch.set_rng_state(state)
    return x + first * torch.rand(x.shape[-1])


def _unused_draw(x: torch.Tensor) -> torch.Tensor:
    torch.rand(5)  # NOTE: nothing reads it; the next draw starts past it, as in eager
    return x + torch.randn(x.shape[-1])


def _unused_draw_then_dropout(x: torch.Tensor) -> torch.Tensor:
    torch.randn(3)
    return nn.functional.dropout(x, 0.5, training=True)


BODIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "manual_seed": _seeded,
    "fork_rng": _forked,
    "get_set_state": _restored,
    "unused_draw": _unused_draw,
    "unused_draw_then_dropout": _unused_draw_then_dropout,
}


class _Net(nn.Module):
    def __init__(self, body: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.lin(x)).tanh()


@pytest.mark.parametrize("body", sorted(BODIES))
def test_training_draws_and_leaves_the_generator_as_eager(body: str) -> None:
    torch.manual_seed(0)
    model = _Net(BODIES[body]).train()
    reference = copy.deepcopy(model)
    compiled = plait.compile(model)
    tol = contract_tol("model", torch.float32)
    for call in range(3):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(call))
        torch.manual_seed(100 + call)
        got = compiled(x)
        after_got = torch.rand(4)
        torch.manual_seed(100 + call)
        want = reference(x)
        after_want = torch.rand(4)
        assert_bitwise(after_got, after_want, f"the generator after call {call}")
        torch.testing.assert_close(got, want, **tol)
        got.square().sum().backward()
        want.square().sum().backward()
        assert_grads_match_and_clear(model, reference, tol)
    (spec,) = compiled.specializations
    assert spec.compiled.manifest.autograd["wrt"]  # NOTE: a training program, not eager


ZERO_GRADIENT_DRAWS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "bernoulli": lambda x, p: x * torch.bernoulli(torch.sigmoid(p).expand_as(x)),
    "normal_mean": lambda x, p: x + torch.normal(p.expand_as(x), 1.0),
    "normal_std": lambda x, p: x + torch.normal(torch.zeros_like(x), p.exp().expand_as(x)),
    "poisson": lambda x, p: x + torch.poisson(p.exp().expand_as(x)),
}


class _Gated(nn.Module):
    def __init__(self, draw: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.p = nn.Parameter(torch.randn(6))
        self.draw = draw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.draw(self.lin(x), self.p)


@pytest.mark.parametrize("draw", sorted(ZERO_GRADIENT_DRAWS))
def test_a_draw_with_a_zero_eager_gradient_gives_zeros(draw: str) -> None:
    torch.manual_seed(0)
    model = _Gated(ZERO_GRADIENT_DRAWS[draw])
    reference = copy.deepcopy(model)
    compiled = plait.compile(model)
    opts = [
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
        for m in (model, reference)
    ]
    tol = contract_tol("model", torch.float32)
    for step in range(2):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
        torch.manual_seed(step)
        got = compiled(x)
        torch.manual_seed(step)
        want = reference(x)
        torch.testing.assert_close(got, want, **tol)
        got.sum().backward()
        want.sum().backward()
        assert reference.p.grad is not None and not reference.p.grad.any()
        assert model.p.grad is not None, "eager's gradient is zeros, never None"
        assert_bitwise(model.p.grad, reference.p.grad, "the gradient of p")
        for opt in opts:
            opt.step()
            opt.zero_grad()
        torch.testing.assert_close(model.p.detach(), reference.p.detach(), **tol)

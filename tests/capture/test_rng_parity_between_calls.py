"""Random numbers inside a compiled module, call after call: the same ``torch.manual_seed``
before eager and before the compiled call gives the same draws (dropout masks, ``torch.rand``,
``randn_like``, ``bernoulli``), the generator ends where eager's call leaves it (a ``torch.rand``
after the call gives eager's number), a module switched between ``train()`` and ``eval()`` after
compiling draws (or not) as eager does, with ``nn.Dropout`` and ``F.dropout(training=
self.training)`` alike, and a ``torch.Generator`` the program draws from is refused loudly."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_bitwise, contract_tol


def _dropout_module(self: _Net, h: torch.Tensor) -> torch.Tensor:
    return self.drop(h)


def _dropout_functional(self: _Net, h: torch.Tensor) -> torch.Tensor:
    return F.dropout(h, 0.3, training=self.training)


def _draws(self: _Net, h: torch.Tensor) -> torch.Tensor:
    noise = torch.rand(h.shape[-1]) + torch.randn_like(h)
    return h * torch.bernoulli(torch.full_like(h, 0.7)) + noise


def _forked(self: _Net, h: torch.Tensor) -> torch.Tensor:
    with torch.random.fork_rng():
        inside = torch.randn_like(h)
    return F.dropout(h + inside, 0.5, training=self.training)


BODIES: dict[str, Callable[[_Net, torch.Tensor], torch.Tensor]] = {
    "nn.Dropout": _dropout_module,
    "F.dropout": _dropout_functional,
    "rand_randn_like_bernoulli": _draws,
    "fork_rng": _forked,
}


class _Net(nn.Module):
    def __init__(self, body: Callable[[_Net, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.4)
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self, self.lin(x).relu())


def _x(seed: int) -> torch.Tensor:
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("body", sorted(BODIES))
def test_draws_and_generator_match_eager_across_train_and_eval(body: str) -> None:
    torch.manual_seed(0)
    model = _Net(BODIES[body])
    reference = copy.deepcopy(model)
    compiled = plait.compile(model)
    tol = contract_tol("model", torch.float32)
    modes = [True, True, False, True, False, False, True]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # NOTE: captured, never the eager fallback
        for call, train in enumerate(modes):
            model.train(train)
            reference.train(train)
            x = _x(call)
            torch.manual_seed(50 + call)
            got = compiled(x)
            after_got = torch.rand(3)
            torch.manual_seed(50 + call)
            want = reference(x)
            after_want = torch.rand(3)
            where = f"call {call} ({'train' if train else 'eval'})"
            assert_bitwise(after_got, after_want, f"{where}: the generator after the call")
            assert_bitwise(got == 0, want == 0, f"{where}: the dropped elements")
            torch.testing.assert_close(got, want, **tol, msg=where)
    assert len(compiled.specializations) == 2  # NOTE: one per training flag, each reused


def _own_generator(x: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return x + torch.rand(x.shape, generator=g)


def _generator_argument(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return F.dropout(x, 0.5) + torch.rand(x.shape, generator=g)


def test_a_generator_object_is_refused_loudly() -> None:
    with pytest.raises(GraphCaptureError, match="Generator"):
        plait.compile(_own_generator, fullgraph=True)(_x(0))
    compiled = plait.compile(_generator_argument)
    for call in range(2):
        x = _x(call)
        torch.manual_seed(call)
        with pytest.warns(CaptureFallbackWarning):
            got = compiled(x, torch.Generator().manual_seed(9))
        torch.manual_seed(call)
        want = _generator_argument(x, torch.Generator().manual_seed(9))
        assert_bitwise(got, want, f"call {call}")

"""The global random number generator inside a compiled program: draws, ``manual_seed``,
``fork_rng`` and a state saved with ``get_rng_state`` and restored with ``set_rng_state`` are
replayed in program order, so each call gives eager's numbers bitwise and leaves the generator
where eager leaves it, over successive calls; what plait cannot replay (a state from outside
the program, a ``torch.Generator``) is refused loudly."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.ir import get_op
from tests.capture.helpers import assert_same
from tests.util import assert_bitwise


def _seeded_dropout(x: torch.Tensor) -> Any:
    torch.manual_seed(3)
    return F.dropout(x, 0.5)


def _reseeded(x: torch.Tensor) -> Any:
    a = F.dropout(x, 0.5)
    torch.manual_seed(11)
    b = F.dropout(x, 0.5)
    torch.random.manual_seed(11)
    return a, b, F.dropout(x, 0.25)


def _forked(x: torch.Tensor) -> Any:
    a = F.dropout(x, 0.5)
    with torch.random.fork_rng():
        b = F.dropout(x, 0.5)
    return a, b, F.dropout(x, 0.5)


def _saved_and_restored(x: torch.Tensor) -> Any:
    state = torch.get_rng_state()
    a = F.dropout(x, 0.5)
    b = F.dropout(x, 0.5)
    torch.set_rng_state(state)
    return a, b, F.dropout(x, 0.5)


def _trailing_seed(x: torch.Tensor) -> Any:
    F.dropout(x, 0.5)  # NOTE: unused, yet it draws
    y = x * 2
    torch.manual_seed(5)
    return y


def _unused_last_draw(x: torch.Tensor) -> Any:
    F.dropout(x, 0.5)
    return x * 2


def _attention(x: torch.Tensor) -> Any:
    torch.manual_seed(1)
    q = x.unsqueeze(0)
    return F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)


REPLAYED: dict[str, Callable[[torch.Tensor], Any]] = {
    "seeded_dropout": _seeded_dropout,
    "reseeded": _reseeded,
    "forked": _forked,
    "saved_and_restored": _saved_and_restored,
    "trailing_seed": _trailing_seed,
    "unused_last_draw": _unused_last_draw,
    "attention": _attention,
}

# PyTorch's random functions have no IR op: random ATen nodes run by PyTorch in program order
RANDOM_CALLS: dict[str, Callable[[torch.Tensor], Any]] = {
    "rand_like_twice": lambda x: torch.rand_like(x) + torch.rand_like(x),
    "bernoulli": lambda x: torch.bernoulli(torch.sigmoid(x)),
    "randn_dtype": lambda x: (torch.randn(2, 3, dtype=torch.float64), x * 2),
    "randperm": lambda x: (torch.randperm(5), x + 1),
    "seeded_mix": lambda x: (
        torch.manual_seed(2),
        torch.randn_like(x) * x + F.dropout(x, 0.5),
        torch.randint_like(x, 10),
    )[1:],
}


def _check_calls(fn: Callable[[torch.Tensor], Any], compiled: Any, calls: int = 4) -> None:
    """Successive calls, reseeded from outside and not: outputs and the generator's state
    afterwards bitwise equal to eager's."""
    for i in range(calls):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(i))
        if i % 2 == 0:
            torch.manual_seed(100 + i)
        start = torch.get_rng_state()
        got = compiled(x)
        after_compiled = torch.get_rng_state()
        torch.set_rng_state(start)
        want = fn(x)
        assert_same(got, want, f"call {i}")
        assert_bitwise(after_compiled, torch.get_rng_state(), f"generator state after call {i}")


@pytest.mark.parametrize("backend", ["eager", "stax"])
@pytest.mark.parametrize("name", list(REPLAYED))
def test_generator_use_is_replayed(name: str, backend: str) -> None:
    fn = REPLAYED[name]
    # NOTE: Stax runs random nodes through PyTorch, a fallback its strict mode (fullgraph) refuses
    compiled = plait.compile(fn, backend=backend, fullgraph=backend == "eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        _check_calls(fn, compiled)
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].program.has_graph


@pytest.mark.parametrize("backend", ["eager", "stax"])
@pytest.mark.parametrize("name", list(RANDOM_CALLS))
def test_random_functions_are_random_nodes(name: str, backend: str) -> None:
    fn = RANDOM_CALLS[name]
    compiled = plait.compile(fn, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: opaque calls warn
        _check_calls(fn, compiled)
    program = compiled.specializations[0].program
    assert program.has_graph, program.fallback_reason
    draws = [n for n in program.graph.nodes if get_op(n.op).is_random(n.attrs)]
    typed = [n for n in draws if n.op in ("aten", "aten_factory")]
    assert typed and all(n.op in ("aten", "aten_factory", "rng_seed", "dropout") for n in draws)
    assert program.opaque_counts == {}


def test_train_mode_module_with_a_seed_inside() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 6)
            self.drop = nn.Dropout(0.4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch.manual_seed(7)
            return self.drop(self.lin(x)).relu()

    torch.manual_seed(0)
    model = Net().train()
    compiled = plait.compile(model, backend="eager", fullgraph=True)
    for i in range(3):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(i))
        got, want = compiled(x), model(x)
        assert_bitwise(got, want, f"call {i}")
        got.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
        model.zero_grad()
        want.sum().backward()
        for g, p in zip(grads, model.parameters()):
            assert_bitwise(g, p.grad, "grad")
        model.zero_grad()


def _outside_state() -> torch.Tensor:
    g = torch.Generator().manual_seed(123)
    torch.randn(3, generator=g)  # NOTE: not a freshly seeded state (that is a manual_seed)
    return g.get_state()


_OUTSIDE = _outside_state()


def _foreign_state(x: torch.Tensor) -> Any:
    torch.set_rng_state(_OUTSIDE)
    return F.dropout(x, 0.5)


def _own_generator(x: torch.Tensor) -> Any:
    g = torch.Generator().manual_seed(4)
    return x + torch.randn(x.shape, generator=g)


@pytest.mark.parametrize(
    ("fn", "strict_match", "match"),
    [
        (_foreign_state, "state it did not have", "state it did not have"),
        (_own_generator, "randn", "Generator"),
    ],
    ids=["foreign_state", "own_generator"],
)
def test_what_cannot_be_replayed_is_refused(
    fn: Callable[[torch.Tensor], Any], strict_match: str, match: str
) -> None:
    x = torch.randn(4, 6)
    state = torch.get_rng_state()
    with pytest.raises(GraphCaptureError, match=strict_match):
        plait.compile(fn, backend="eager", fullgraph=True)(x)
    assert_bitwise(torch.get_rng_state(), state, "capture leaves the generator untouched")
    compiled = plait.compile(fn, backend="eager")
    with pytest.warns(CaptureFallbackWarning, match=match):
        compiled(x)
    assert compiled.specializations[0].program.fallback_reason is not None
    _check_calls(fn, compiled)


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_random_functions_compile_under_fullgraph(backend: str) -> None:
    fn = RANDOM_CALLS["rand_like_twice"]
    _check_calls(fn, plait.compile(fn, backend=backend, fullgraph=True))


def test_a_random_call_with_its_own_generator_is_refused_under_fullgraph() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.rand_like(x) + torch.bernoulli(x.sigmoid(), generator=torch.Generator())

    with pytest.raises(GraphCaptureError, match="Generator"):
        plait.compile(fn, backend="eager", fullgraph=True)(torch.randn(3))

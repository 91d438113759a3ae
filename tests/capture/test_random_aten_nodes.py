"""Random ATen ops (``torch.Tag.nondeterministic_seeded``) inside a call with no capture rule
become random ``aten`` nodes: no opaque node, no fallback, run in program order. Under the same
``torch.manual_seed`` the compiled program gives eager's values bit for bit on fresh inputs, and
the generator ends where eager leaves it (the next draws are eager's next draws)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import CaptureFallbackWarning
from plait.ir import GraphBuilder, TensorType, get_op
from tests.capture.helpers import assert_same


def _fresh(seed: int, shape: tuple[int, ...] = (3, 4, 5)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 + seed))


def _probability(seed: int) -> torch.Tensor:
    return torch.rand((3, 4, 5), generator=torch.Generator().manual_seed(2000 + seed))


PROGRAMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "uniform_": lambda x: (x * 2).uniform_(-1.0, 3.0),
    "cauchy_": lambda x: (x + 1).cauchy_(0.5, 2.0),
    "exponential_": lambda x: (x * 1).exponential_(0.7),
    "geometric_": lambda x: (x * 1).geometric_(0.3),
    "log_normal_": lambda x: (x * 1).log_normal_(0.2, 0.5),
    "normal_": lambda x: (x * 1).normal_(1.0, 2.0),
    "normal_tensor_mean": lambda x: torch.normal(x, 0.5),
    "normal_number_mean": lambda x: torch.normal(0.5, x.abs() + 0.1),
    "normal_tensor_tensor": lambda x: torch.normal(x, x.abs() + 0.1),
    "bernoulli": lambda x: torch.bernoulli(x.sigmoid()),
    "bernoulli_p": lambda x: torch.bernoulli(x, 0.3),
    "randint_like": lambda x: torch.randint_like(x, 3, 10),
    "rand_like": lambda x: torch.rand_like(x) * x,
    "randn_like": lambda x: torch.randn_like(x) + x,
    "dropout2d": lambda x: F.dropout2d(x.unsqueeze(0), 0.4, training=True),
    "dropout3d": lambda x: F.dropout3d(x.unsqueeze(0).unsqueeze(0), 0.4, training=True),
    "alpha_dropout": lambda x: F.alpha_dropout(x, 0.3, training=True),
    "feature_alpha_dropout": lambda x: F.feature_alpha_dropout(x, 0.3, training=True),
    "rrelu": lambda x: F.rrelu(x, 0.1, 0.4, training=True),
    "two_draws_in_order": lambda x: torch.rand_like(x) - 2 * torch.randn_like(x),
}


def _draws(compiled: Any) -> list[Any]:
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None and spec.opaque_counts == {}
    assert spec.manifest.fallbacks == []
    return [n for n in spec.graph.nodes if get_op(n.op).is_random(n.attrs)]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_random_aten_ops_draw_what_eager_draws(name: str) -> None:
    fn = PROGRAMS[name]
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1, 7):  # NOTE: the capture draw, then fresh inputs under other seeds
        x = _fresh(seed)
        torch.manual_seed(seed)
        got = compiled(x.clone())
        next_compiled = torch.rand(6)
        torch.manual_seed(seed)
        want = fn(x.clone())
        next_eager = torch.rand(6)
        assert_same(got, want, f"{name} seed {seed}")
        assert_same(next_compiled, next_eager, f"{name}: the generator after seed {seed}")
    draws = _draws(compiled)
    assert draws and all(n.op in ("aten", "aten_factory") for n in draws), draws


def test_in_place_draw_into_an_input_writes_it_back() -> None:
    """``x.uniform_()`` on the caller's tensor: the compiled program writes it (and returns
    it) as eager does."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.uniform_(-2.0, 2.0)

    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 3):
        mine, theirs = _fresh(seed), _fresh(seed)
        torch.manual_seed(seed)
        got = compiled(mine)
        torch.manual_seed(seed)
        fn(theirs)
        assert_same(mine, theirs, f"the written input, seed {seed}")
        assert got is mine
    assert [n.attrs["name"] for n in _draws(compiled)] == ["uniform"]


def test_draws_interleave_with_seeding_in_program_order() -> None:
    def fn(x: torch.Tensor) -> Any:
        a = torch.bernoulli(x.sigmoid())
        torch.manual_seed(5)
        b = F.alpha_dropout(x, 0.5, training=True)
        return a, b, torch.randint_like(x, 100)

    # NOTE: the eager backend: Stax's strict mode refuses rng_seed (a PyTorch fallback there)
    compiled = plait.compile(fn, backend="eager", fullgraph=True)
    for seed in (0, 2):
        x = _fresh(seed)
        torch.manual_seed(seed)
        got = compiled(x)
        torch.manual_seed(seed)
        assert_same(got, fn(x), f"seed {seed}")


def test_unused_draw_still_moves_the_generator() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        torch.rand_like(x)  # NOTE: dead, but eager's generator moves
        return x + 1

    compiled = plait.compile(fn, fullgraph=True)
    torch.manual_seed(4)
    compiled(_fresh(4))
    after = torch.rand(5)
    torch.manual_seed(4)
    fn(_fresh(4))
    assert_same(after, torch.rand(5), "the generator after the call")


def test_bernoulli_with_tensor_probability_on_fresh_probabilities() -> None:
    fn = torch.bernoulli
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 5):
        p = _probability(seed)
        torch.manual_seed(seed)
        got = compiled(p)
        torch.manual_seed(seed)
        assert_same(got, fn(p), f"seed {seed}")


def test_rrelu_with_a_gradient_gets_eagers_gradient() -> None:
    """``rrelu_with_noise_functional``'s backward reads the noise argument, not the noise it
    drew: with a gradient flowing, rrelu keeps eager's call (an opaque random node)."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.rrelu(x, 0.1, 0.4, training=True) * x

    compiled = plait.compile(fn)
    for seed in (0, 1):
        mine = _fresh(seed).requires_grad_()
        theirs = _fresh(seed).requires_grad_()
        torch.manual_seed(seed)
        with pytest.warns(CaptureFallbackWarning) if seed == 0 else contextlib.nullcontext():
            got = compiled(mine)
        got.sum().backward()
        torch.manual_seed(seed)
        want = fn(theirs)
        want.sum().backward()
        assert_same(got, want, f"seed {seed}")
        assert_same(mine.grad, theirs.grad, f"the gradient, seed {seed}")


@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_a_seeded_overload_draws_unless_its_arguments_turn_the_draw_off(dropout_p: float) -> None:
    """ATen's CPU flash attention is tagged seeded; with ``dropout_p=0`` it draws nothing, so
    its node is not random (its result layout is learned like any extern's)."""
    gb = GraphBuilder()
    qkv = [gb.input(n, TensorType((2, 2, 8, 4), torch.float32)) for n in "qkv"]
    literals = json.dumps([{"t": 0}, {"t": 1}, {"t": 2}, dropout_p, True])
    out = gb.call(
        "aten", qkv, name="_scaled_dot_product_flash_attention_for_cpu", overload="default",
        literals=literals, kwliterals=json.dumps({}),
    )  # fmt: skip
    gb.output(out[0])
    (node,) = gb.build().nodes
    assert get_op("aten").is_random(node.attrs) is (dropout_p > 0)

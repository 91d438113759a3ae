"""A program whose result dtypes come from ``torch.get_default_dtype()`` (integer true division,
an integer tensor times a float, math on integers, factories without ``dtype=``) compiles under
the default in force at capture and computes what eager does there, float64, float16 and
bfloat16 alike; a call after the default changes gets a program built under the new one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import plait
from tests.util import assert_bitwise, contract_tol

DEFAULTS = [torch.float64, torch.float16, torch.bfloat16]


@pytest.fixture
def restore_default() -> Iterator[None]:
    before = torch.get_default_dtype()
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _ints(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1000, 1000, (6,), generator=g)


def _floats(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, generator=g, dtype=torch.get_default_dtype())


# NOTE: each program takes (integer tensor, default-dtype tensor); results must be eager's bits
BITWISE: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "arange_true_division": lambda i, x: x + torch.arange(6) / 3,
    "integer_true_division": lambda i, x: i / 7,
    "integers_divided": lambda i, x: i / (i.abs() + 1),
    "integer_times_float": lambda i, x: i * 0.1,
    "integer_plus_float": lambda i, x: i + 0.3,
    "integer_below_float": lambda i, x: i < 100.5,
    "where_integer_or_float": lambda i, x: torch.where(i > 0, i, 0.5),
    "clamp_integer_by_float": lambda i, x: torch.clamp(i, min=-10.5),
    "scalar_tensor": lambda i, x: x + torch.tensor(1.5),
    "zeros": lambda i, x: x + torch.zeros(6),
    "full": lambda i, x: x * torch.full((6,), 0.5),
    "linspace": lambda i, x: x + torch.linspace(0, 1, 6),
}
CLOSE: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "sqrt_of_integers": lambda i, x: torch.sqrt(i.abs()),
    "exp_of_integers": lambda i, x: torch.exp(i / 500),
    "logsumexp_of_integers": lambda i, x: torch.logsumexp(i.reshape(2, 3), 1),
}


@pytest.mark.parametrize("default", DEFAULTS, ids=str)
@pytest.mark.parametrize("name", sorted(BITWISE))
def test_default_dtype_results_are_eagers(
    name: str, default: torch.dtype, restore_default: None
) -> None:
    torch.set_default_dtype(default)
    fn = BITWISE[name]
    compiled = plait.compile(fn)
    for seed in (0, 1, 2):  # NOTE: the capture draw, then two fresh ones
        i, x = _ints(seed), _floats(seed + 10)
        assert_bitwise(compiled(i, x), fn(i, x), f"{name} draw {seed}")


@pytest.mark.parametrize("default", DEFAULTS, ids=str)
@pytest.mark.parametrize("name", sorted(CLOSE))
def test_default_dtype_math_is_eagers(
    name: str, default: torch.dtype, restore_default: None
) -> None:
    torch.set_default_dtype(default)
    fn = CLOSE[name]
    compiled = plait.compile(fn)
    for seed in (0, 1, 2):
        i, x = _ints(seed), _floats(seed + 10)
        got, want = compiled(i, x), fn(i, x)
        assert got.dtype == want.dtype == default
        torch.testing.assert_close(got, want, **contract_tol("pointwise", default))


def test_random_draw_under_float64_default_is_eagers(restore_default: None) -> None:
    torch.set_default_dtype(torch.float64)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + torch.randn(6)

    compiled = plait.compile(fn)
    for seed in (0, 1):
        x = _floats(seed)
        torch.manual_seed(seed)
        got = compiled(x)
        torch.manual_seed(seed)
        assert_bitwise(got, fn(x), f"draw {seed}")


def test_a_changed_default_gets_a_program_built_under_it(restore_default: None) -> None:
    def fn(i: torch.Tensor) -> torch.Tensor:
        return i / 3 + torch.ones(6)

    compiled = plait.compile(fn)
    for seed, default in enumerate([torch.float32, torch.float64, torch.float32, torch.float64]):
        torch.set_default_dtype(default)
        i = _ints(seed)
        assert_bitwise(compiled(i), fn(i), f"call {seed} under {default}")
    assert len(compiled.specializations) == 2


def test_mean_of_integers_raises_as_eager(restore_default: None) -> None:
    torch.set_default_dtype(torch.float64)

    def fn(i: torch.Tensor) -> torch.Tensor:
        return torch.mean(i)

    i = _ints(0)
    with pytest.raises(RuntimeError) as eager:
        fn(i)
    with pytest.raises(RuntimeError) as ours:
        plait.compile(fn)(i)
    assert str(eager.value).splitlines()[0] in str(ours.value)


def test_a_factory_left_to_the_default_types_under_each_default(restore_default: None) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + torch.linspace(0, 1, 6)

    for default in (torch.float16, torch.bfloat16, torch.float64):
        torch.set_default_dtype(default)
        compiled = plait.compile(fn)
        x = _floats(3)
        assert_bitwise(compiled(x), fn(x), f"under {default}")

"""A symbolic size that the program turns into a plain Python int is specialized: the compiled
program answers as eager at every size, recompiling where the int differs. ``len(x)``,
``unbind``/iteration (one result per index), ``x[k]`` past a smaller size, and int operators
that CPython computes from the sample's value (bitwise, ``divmod``, ``2 ** n``, ``abs``, ``str``)
each returned the captured size's answer at every later size."""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning

TOL = plait.contract.load().tolerance("model", torch.float32)
SIZES = (5, 7, 2, 3, 13, 4, 9)


def _judge(fn: Callable[..., Any], make: Callable[[int], tuple[torch.Tensor, ...]]) -> None:
    compiled = plait.compile(
        fn, dynamic=True, options={"cache": False, "recompile_limit": 2 * len(SIZES)}
    )
    for seed, n in enumerate(SIZES):
        torch.manual_seed(seed)
        args = make(n)
        try:
            want = fn(*args)
        except IndexError:
            with pytest.raises(IndexError):
                compiled(*args)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(*args)
        if isinstance(want, torch.Tensor):
            got, want = [got], [want]
        assert len(got) == len(want), (n, len(got), len(want))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=TOL.rtol, atol=TOL.atol)


def _rows(n: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(n, 3),)


def test_len_of_a_tensor() -> None:
    _judge(lambda x: x * len(x), _rows)


def test_unbind_along_a_symbolic_dim() -> None:
    _judge(lambda x: [t * 2 for t in x.unbind(1)], lambda n: (torch.randn(3, n),))
    _judge(lambda x: torch.stack(x.unbind(0)[::-1]), _rows)


def test_iterating_over_a_tensor() -> None:
    _judge(lambda x: [row * 2 for row in x], _rows)


def test_an_index_past_a_later_smaller_size_raises_as_eager() -> None:
    _judge(lambda x: x[2] * 2, _rows)
    _judge(lambda x: x[:, 3] + x[:, -4], lambda n: (torch.randn(2, n),))


OPERATORS: dict[str, Callable[[Any], Any]] = {
    "rpow": lambda n: 2**n,
    "and": lambda n: n & 1,
    "or": lambda n: n | 1,
    "xor": lambda n: n ^ 3,
    "lshift": lambda n: n << 1,
    "rshift": lambda n: n >> 1,
    "invert": lambda n: ~n,
    "abs": lambda n: abs(n - 6),
    "divmod": lambda n: divmod(n, 3)[1],
    "str": lambda n: int(str(n)),
    "format": lambda n: int(f"{n:d}"),
    "bit_length": lambda n: n.bit_length(),
    "floor_ceil_round": lambda n: math.floor(n) + math.ceil(n) + round(n) + math.trunc(n),
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_int_operators_on_a_size(name: str) -> None:
    g = OPERATORS[name]
    _judge(lambda x: x * g(x.shape[0]), _rows)


def test_floor_ceil_and_round_of_a_size_stay_symbolic() -> None:
    fn = lambda x: x[: math.floor(x.shape[0]) - 1] * round(x.shape[1])
    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    for n in (5, 7, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(compiled(x), fn(x), rtol=TOL.rtol, atol=TOL.atol)
    assert len(compiled.specializations) == 1


# NOTE: CPython reads an int's value directly in these (range's and operator.index's
# PyNumber_Index, float arithmetic with the float on the left, math.log's integer path, list
# repetition): a traced size is no int subclass, so each reaches __index__ or __float__.
# operator.index is read as a global: __import__ inside the lambda would read (and guard) the
# whole module namespace, whose __loader__ under pytest reaches the session's every test item
CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "range": lambda n: len(range(n)),
    "float_on_the_left": lambda n: 0.5 * n,
    "math_log2": lambda n: math.log2(n),
    "operator_index": lambda n: operator.index(n),
    "list_repetition": lambda n: len([0] * n),
    "float_comparison": lambda n: 1.0 if n > 4.5 else 2.0,
    "hash": lambda n: hash(n) % 5,
    "to_bytes": lambda n: n.to_bytes(2, "little")[0],
    "gcd": lambda n: math.gcd(n, 4),
    "isqrt": lambda n: math.isqrt(n),
    "list_index": lambda n: list(range(20, 40))[n],
    "sqrt": lambda n: math.sqrt(n),
}


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_conversions_that_read_the_value_directly(name: str) -> None:
    g = CONVERSIONS[name]
    _judge(lambda x: x * g(x.shape[0]), _rows)


def test_a_loop_over_a_symbolic_size_unrolls_per_size() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        out = x[0]
        for i in range(1, x.shape[0]):
            out = out * 0.5 + x[i]
        return out

    _judge(fn, _rows)


def test_a_size_is_an_int_to_isinstance_as_in_eager() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        return x * 2 if isinstance(n, int) and isinstance(n, numbers.Integral) else x * 3

    _judge(fn, _rows)


SCALAR_OPERANDS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mean_by_hand": lambda x: x.sum(0) / x.shape[0],
    "scaled": lambda x: x * x.shape[0] - x.shape[1],
    "reflected": lambda x: x.shape[1] / (x.abs() + 1),
    "integer_tensor": lambda x: (x > 0).long() * x.shape[0] + 1,
    "comparison": lambda x: (x * 4 > x.shape[0]).float(),
    "where": lambda x: torch.where(x > 0, x, x.shape[1]),
    "size_expression": lambda x: x / (x.shape[0] * x.shape[1] + x.shape[0] % 3),
    "full_like": lambda x: torch.full_like(x, x.shape[0]) + x,
}


@pytest.mark.parametrize("name", sorted(SCALAR_OPERANDS))
def test_a_size_used_as_a_scalar_operand_stays_symbolic(name: str) -> None:
    """``x / x.shape[0]``: the size is a size-expression operand that each call computes from
    its own sizes, not a specialization per size (which met the recompile limit)."""
    fn = SCALAR_OPERANDS[name]
    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    for seed, n in enumerate(SIZES * 2):
        torch.manual_seed(seed)
        x = torch.randn(n, 3 + seed % 4)
        torch.testing.assert_close(compiled(x), fn(x), rtol=TOL.rtol, atol=TOL.atol)
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].manifest.executor["backend"] == "stax"


def test_a_size_operand_in_a_training_program() -> None:
    def loss(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return ((x @ w).square().sum(0) / x.shape[0]).sum()

    compiled = plait.compile(loss, dynamic=True, options={"cache": False})
    for seed, n in enumerate(SIZES):
        torch.manual_seed(seed)
        w = torch.randn(3, 2, requires_grad=True)
        w2 = w.detach().clone().requires_grad_()
        x = torch.randn(n, 3)
        loss(w, x).backward()
        compiled(w2, x).backward()
        torch.testing.assert_close(w2.grad, w.grad, rtol=TOL.rtol, atol=TOL.atol)
    assert len(compiled.specializations) == 1

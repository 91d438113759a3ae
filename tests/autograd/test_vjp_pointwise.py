"""Derivative rules of pointwise ops against PyTorch autograd and finite differences.

Beside the op database's samples (:func:`check_op`), every rule is compared with eager autograd
where the conventions live: zeros, signed zeros, ties, bounds, infinities and NaN (finite
differences say nothing there, eager's formulas decide).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch

import plait.contract
from plait.ir import Category, all_ops, get_op
from plait.ir.ops.vjp import is_differentiable
from tests.autograd.vjp_check import F64, OneOp, check_op
from tests.ir.opdb import Sample
from tests.util import assert_bitwise

OPS = sorted(
    n for n, o in all_ops().items() if o.category is Category.POINTWISE and is_differentiable(n)
)


@pytest.mark.parametrize("op", OPS)
def test_pointwise_vjp(op: str) -> None:
    check_op(op)


INF, NAN = math.inf, math.nan
# NOTE: the kinks and bounds of the ops below (0, +-0.5, +-1, +-3, 20), their signed zeros and
# the non-finite values
SPECIALS = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, 3.0, -3.0, 0.3, -2.7, 20.0, 25.0, -25.0,
            INF, -INF, NAN]  # fmt: skip
PAIR_VALUES = [0.0, -0.0, 1.5, -2.0, 2.0, 0.5, INF, -INF, NAN]


def _pairs() -> tuple[torch.Tensor, torch.Tensor]:
    """Every ordered pair of PAIR_VALUES (ties included), as two 1-d tensors."""
    a, b = zip(*itertools.product(PAIR_VALUES, repeat=2))
    return torch.tensor(a, dtype=F64), torch.tensor(b, dtype=F64)


def _specials() -> torch.Tensor:
    return torch.tensor(SPECIALS, dtype=F64)


def _cotangent(like: torch.Tensor) -> torch.Tensor:
    return torch.randn(like.shape, generator=torch.Generator().manual_seed(0), dtype=like.dtype)


def _gradients(
    op: str, args: list[Any], attrs: dict[str, Any], partitioner: str, *, eager: bool = True
) -> tuple:
    """(ours, eager's): the gradients of ``op`` for one random cotangent."""
    one = OneOp(Sample(op, args, attrs, lambda: None, "edge values"), partitioner)
    leaves = [t.detach().clone().requires_grad_(t.dtype == F64) for t in one.inputs()]
    ours = one(*leaves)
    cot = _cotangent(ours)
    wrt = [t for t in leaves if t.requires_grad]
    got = torch.autograd.grad(ours, wrt, cot, allow_unused=True)
    if not eager:
        return got, None
    refs = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    theirs = one.reference(*refs)
    want = torch.autograd.grad(theirs, [t for t in refs if t.requires_grad], cot, allow_unused=True)
    return got, want


def _assert_eager(op: str, args: list[Any], attrs: dict[str, Any] | None = None) -> None:
    tol = plait.contract.load().gradcheck
    for partitioner in ("save-all", "min-cut"):
        got, want = _gradients(op, args, attrs or {}, partitioner)
        for k, (a, e) in enumerate(zip(got, want)):
            where = f"{op} {attrs} {partitioner}: gradient {k}"
            assert a is not None and e is not None, f"{where} missing"

            def message(m: str, where: str = where) -> str:
                return f"{where}: {m}"

            torch.testing.assert_close(
                a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True, msg=message
            )


UNARY_ATTRS: dict[str, list[dict[str, Any]]] = {
    "gelu": [{"approximate": "none"}, {"approximate": "tanh"}],
    "leaky_relu": [{"negative_slope": 0.01}, {"negative_slope": -0.3}],
    "elu": [
        {"alpha": 1.0, "scale": 1.0, "input_scale": 1.0},
        {"alpha": 1.6732632423543772, "scale": 1.0507009873554805, "input_scale": 1.0},
        {"alpha": 1.3, "scale": 1.0, "input_scale": 1.0 / 1.3},
    ],
    "softplus": [{"beta": 1.0, "threshold": 20.0}, {"beta": 2.0, "threshold": 3.0}],
    "hardshrink": [{"lambd": 0.5}, {"lambd": 0.3}],
    "softshrink": [{"lambd": 0.5}, {"lambd": 0.3}],
    "threshold": [{"threshold": 0.5, "value": 20.0}, {"threshold": -INF, "value": 0.0}],
    "clamp": [{"min": -1, "max": 1}, {"min": 0.5}, {"max": -0.5}, {"min": 2.0, "max": -1.0}],
    "round": [{"decimals": 0}, {"decimals": 1}],
    "to_dtype": [{"dtype": torch.float64}, {"dtype": torch.float32}],
    "tril": [{"diagonal": 0}],
    "triu": [{"diagonal": 1}],
}
UNARY = sorted(o for o in OPS if [p.name for p in get_op(o).params] == ["x"])


@pytest.mark.parametrize("op", UNARY)
def test_unary_vjp_at_edge_values_is_eager(op: str) -> None:
    x = _specials()
    if op in ("tril", "triu"):
        x = x[:16].reshape(4, 4)
    for attrs in UNARY_ATTRS.get(op, [{}]):
        _assert_eager(op, [x], attrs)


BINARY = sorted(o for o in OPS if [p.name for p in get_op(o).params] == ["a", "b"])


@pytest.mark.parametrize("op", BINARY)
def test_binary_vjp_at_edge_values_is_eager(op: str) -> None:
    a, b = _pairs()
    _assert_eager(op, [a, b])
    # NOTE: broadcasting sums the gradient over what it added
    _assert_eager(op, [a.reshape(9, 9), b[:9].reshape(9, 1)])
    if op == "div":
        for mode in ("trunc", "floor"):
            _assert_eager(op, [a, b], {"rounding_mode": mode})


SCALAR_CASES: list[tuple[str, list[Any]]] = [
    *(("pow", ["x", e]) for e in (0, 1, 2, 3, 0.5, -1, -2.5, 2.0, 0.0)),
    *(("pow", [s, "x"]) for s in (0, 0.0, 2, 0.5, -2.0, 1)),
    ("div", ["x", 2.5]),
    ("div", ["x", 0.0]),
    ("add", [2.0, "x"]),
    ("sub", [2.0, "x"]),
    ("mul", ["x", -1.5]),
    ("xlogy", ["x", 0.0]),
    ("xlogy", ["x", 3]),
    ("xlogy", [0.0, "x"]),
    ("xlogy", [2.0, "x"]),
    ("copysign", ["x", -1.0]),
    ("copysign", ["x", 0.0]),
    ("fmod", ["x", 2.5]),
    ("remainder", ["x", -3]),
]


@pytest.mark.parametrize("op,args", SCALAR_CASES, ids=lambda v: str(v))
def test_scalar_operand_vjp_is_eager(op: str, args: list[Any]) -> None:
    x = _specials()
    _assert_eager(op, [x if a == "x" else a for a in args])


def test_number_remainder_tensor_vjp() -> None:
    """Eager has no derivative of ``number % tensor``; the rule is the tensor % tensor one,
    ``-g * floor(a / b)``, checked against it."""
    x = torch.tensor([1.5, -2.0, 0.7, 3.0, -0.3, 5.0], dtype=F64)
    got, _ = _gradients("remainder", [5, x], {}, "min-cut", eager=False)
    a = torch.full_like(x, 5.0, requires_grad=True)
    b = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(torch.remainder(a, b), [b], _cotangent(x))
    assert_bitwise(got[0], want, "5 % x: the tensor % tensor gradient")


def test_where_vjp_is_eager() -> None:
    cond = torch.tensor([[True, False, True], [False, False, True]])
    a, b = _specials()[:6].reshape(2, 3), _specials()[-3:]
    _assert_eager("where", [cond, a, b])
    _assert_eager("where", [cond, 2, b])
    _assert_eager("where", [cond, a, -INF])


def test_pow_of_two_tensors_at_zero_is_eager() -> None:
    # NOTE: eager: d/da is 0 where b == 0; d/db is 0 where a == 0 and b >= 0
    a = torch.tensor([0.0, 0.0, 0.0, -0.0, 2.0, -2.0, 0.5, NAN, 0.0], dtype=F64)
    b = torch.tensor([0.0, 2.0, -1.0, 0.5, 0.0, 0.5, -INF, 0.0, NAN], dtype=F64)
    _assert_eager("pow", [a, b])


def test_pow_exponent_gradient_takes_the_log_in_the_result_dtype() -> None:
    a = torch.tensor([0.3, 1.7, 2.9, 0.0], dtype=torch.float32)  # a constant: float32
    b = torch.tensor([1.5, -0.5, 2.0, 3.0], dtype=F64)
    _assert_eager("pow", [a, b])


@pytest.mark.parametrize("op", ["floor", "ceil", "round", "trunc", "sign", "frac"])
def test_rounding_vjp_is_eager(op: str) -> None:
    """floor, ceil, round, trunc and sign have zero gradients (a tensor of zeros, as eager's,
    not a missing gradient); frac's is the identity."""
    x = torch.tensor([-2.5, -1.5, -0.4, 0.0, 0.5, 1.5, 2.7, INF, NAN], dtype=F64)
    attrs = {"decimals": 0} if op == "round" else {}
    got, want = _gradients(op, [x], attrs, "min-cut")
    assert got[0] is not None
    expected = torch.zeros_like(x) if op != "frac" else None
    identity = _cotangent(x)
    assert_bitwise(got[0], identity if expected is None else expected, f"{op}'s gradient")
    assert_bitwise(got[0], want[0], f"{op}'s gradient against eager's")

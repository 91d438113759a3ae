"""Symbolic dims: text round trip, evaluation, and symbolic type rules checked against PyTorch."""

from __future__ import annotations

import pytest
import sympy
import torch
from hypothesis import given
from hypothesis import strategies as st

from plait.ir import TensorType, Value, get_op
from plait.ir.ops import TypeRuleError
from plait.symbolic import (
    DimParseError,
    dim_to_text,
    evaluate,
    known_equal,
    known_not_equal,
    parse_dim,
    symbol,
)

S = [symbol(f"s{i}") for i in range(3)]


@st.composite
def dim_exprs(draw: st.DrawFn, depth: int = 3) -> sympy.Expr:
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from([*S, sympy.Integer(draw(st.integers(0, 9)))]))
    a, b = draw(dim_exprs(depth - 1)), draw(dim_exprs(depth - 1))
    op = draw(st.sampled_from(["+", "*", "floordiv", "mod", "max"]))
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "max":
        return sympy.Max(a, b)
    d = draw(st.integers(1, 5))
    return sympy.floor(a / d) if op == "floordiv" else sympy.Mod(a, d)


@given(dim_exprs())
def test_dim_text_round_trip(e: sympy.Expr) -> None:
    text = dim_to_text(e)
    back = parse_dim(text)
    assert dim_to_text(back) == text
    values = {"s0": 3, "s1": 7, "s2": 2}
    if not isinstance(back, int):
        assert evaluate(back, values) == evaluate(sympy.Integer(0) + e, values)


def test_parse_errors_name_the_position() -> None:
    with pytest.raises(DimParseError) as info:
        parse_dim("2*s0 + ")
    assert info.value.pos == len("2*s0 + ")
    with pytest.raises(DimParseError):
        parse_dim("s0 $ 1")
    with pytest.raises(DimParseError):
        parse_dim("__import__('os')")


def test_known_equal() -> None:
    s0, s1 = S[0], S[1]
    assert known_equal(2 * s0 + s0, 3 * s0)
    assert not known_equal(s0, s1)
    assert known_not_equal(s0 + 1, s0)
    assert not known_not_equal(s0, s1)


def test_symbol_names() -> None:
    with pytest.raises(ValueError):
        symbol("1x")
    assert symbol("s0").is_positive and symbol("s0").is_integer


def _concrete(t: TensorType, binding: dict[str, int]) -> tuple[int, ...]:
    return tuple(evaluate(d, binding) for d in t.shape)


@pytest.mark.parametrize("n", [1, 4, 9])
def test_split_symbolic(n: int) -> None:
    s0, s1 = S[0], S[1]
    x = Value("x", TensorType((s0, s1 + 3), torch.float32))
    split = get_op("split")
    types = split.output_types((x,), split.check_attrs({"sizes": (s1, 3), "dim": 1}))
    binding = {"s0": 2, "s1": n}
    real = torch.randn(2, n + 3).split([n, 3], dim=1)
    assert [_concrete(t, binding) for t in types] == [tuple(r.shape) for r in real]  # type: ignore[arg-type]


@pytest.mark.parametrize(("start", "end", "step"), [(0, 100, 1), (2, None, 2), (1, 3, 1)])
@pytest.mark.parametrize("n", [1, 2, 5, 11])
def test_slice_symbolic_clamps_like_python(start: int, end: int | None, step: int, n: int) -> None:
    s0 = S[0]
    x = Value("x", TensorType((3, s0), torch.float32))
    op = get_op("slice")
    (t,) = op.output_types(
        (x,), op.check_attrs({"dim": 1, "start": start, "end": end, "step": step})
    )
    real = torch.randn(3, n)[:, start:end:step]
    assert _concrete(t, {"s0": n}) == tuple(real.shape)  # type: ignore[arg-type]


def test_broadcast_undecidable_is_an_error() -> None:
    a = Value("a", TensorType((S[0],), torch.float32))
    b = Value("b", TensorType((S[1],), torch.float32))
    with pytest.raises(TypeRuleError, match="specialize"):
        get_op("add").output_types((a, b), {"alpha": 1})


def test_reshape_symbolic() -> None:
    s0 = S[0]
    x = Value("x", TensorType((s0, 4, 6), torch.float32))
    op = get_op("reshape")
    (t,) = op.output_types((x,), op.check_attrs({"shape": (-1, 24)}))
    assert isinstance(t, TensorType) and t.shape == (s0, 24)
    (t,) = op.output_types((x,), op.check_attrs({"shape": (4 * s0, -1)}))
    assert isinstance(t, TensorType) and t.shape == (4 * s0, 6)


@pytest.mark.parametrize(("start", "step", "n"), [(0, 1, 7), (2, 3, 11), (0, 2, 1), (5, 1, 5)])
def test_arange_symbolic_end(start: int, step: int, n: int) -> None:
    op = get_op("arange")
    attrs = op.check_attrs({"start": start, "end": S[0], "step": step, "dtype": torch.int64})
    (t,) = op.output_types((), attrs)
    assert isinstance(t, TensorType)
    assert _concrete(t, {"s0": n}) == tuple(torch.arange(start, n, step).shape)

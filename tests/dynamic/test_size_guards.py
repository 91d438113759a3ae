"""Size guards of symbolic programs: the simplified relations admit exactly the sizes the
captured comparisons (with their outcomes, and each symbol's own ``>= 2``) admit."""

from __future__ import annotations

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.frontend.size_guards import SYMBOL_MIN, simplified

S, T = (
    sympy.Symbol("s0", integer=True, positive=True),
    sympy.Symbol("s1", integer=True, positive=True),
)
RELATIONS = (sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge, sympy.Eq)

relation = st.builds(
    lambda op, k, m, c, sym: op(k * sym + m, c, evaluate=False),
    st.sampled_from(RELATIONS),
    st.integers(-3, 3).filter(bool),
    st.integers(-5, 5),
    st.integers(-20, 40),
    st.sampled_from([S, T]),
)
mixed = st.builds(lambda op, c: op(S * T, c, evaluate=False), st.sampled_from(RELATIONS[:4]),
                  st.integers(4, 60))  # fmt: skip


def _admitted(preds: list[tuple[object, bool]]) -> set[tuple[int, int]]:
    """The sizes (s, t) the relations admit, each symbol at least 2."""
    checks = [(sympy.lambdify((S, T), rel), outcome) for rel, outcome in preds]
    return {
        (s, t)
        for s in range(SYMBOL_MIN, 30)
        for t in range(SYMBOL_MIN, 12)
        if all(bool(fn(s, t)) == outcome for fn, outcome in checks)
    }


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.one_of(relation, mixed), st.booleans()), max_size=5))
def test_simplified_guards_admit_the_same_sizes(preds: list[tuple[object, bool]]) -> None:
    preds = [(r, o) for r, o in preds if r not in (sympy.true, sympy.false)]
    guards = simplified(preds, {S, T})
    assert all(outcome for rel, outcome in guards)
    assert _admitted(guards) == _admitted(preds), (preds, guards)


def test_bounds_are_merged_and_stated_as_what_holds() -> None:
    preds = [
        (S > 64, False),
        (sympy.Ge(S, 1, evaluate=False), True),
        (S <= 100, True),
        (S * T > 8, True),
        (S * T > 8, True),
    ]
    assert [(str(r), o) for r, o in simplified(preds, {S, T})] == [
        ("s0 <= 64", True),
        ("s0*s1 > 8", True),
    ]
    tight = [(S > 2, True), (2 * S + 1 > 9, True), (S < 40, True), (S <= 30, True)]
    assert [str(r) for r, _ in simplified(tight, {S})] == ["2*s0 + 1 > 9", "s0 <= 30"]


def test_static_comparisons_stay_as_captured() -> None:
    static = sympy.Symbol("s3", integer=True, positive=True)
    preds = [(static > 2, True), (static < 2, False)]
    assert simplified(preds, {S}) == preds

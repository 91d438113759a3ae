"""Sizes as polynomials and index algebra over them: every proof is sound and every
simplification exact, for random symbol values (hypothesis), checked by brute force."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from plait.codegen.index import Clamp, Div, Ix, Mod, Var, ravel, unravel
from plait.symbolic import symbol
from plait.symbolic.poly import (
    Poly,
    Size,
    evaluate,
    exact_quotient,
    from_dim,
    le,
    lower_bound,
    lt,
    nonneg,
    to_dim,
)

S0, S1 = from_dim(symbol("s0")), from_dim(symbol("s1"))
SYMBOLS = {"s0": S0, "s1": S1}
values = st.fixed_dictionaries({"s0": st.integers(1, 6), "s1": st.integers(1, 6)})


def size(x: Size, at: dict[str, int]) -> int:
    return evaluate(x, at)


def index(ix: Ix, env: dict[Var, int], at: dict[str, int]) -> int:
    """``ix`` at loop point ``env`` and symbol values ``at``, as C++ computes it (floor division
    and modulo of nonnegative operands; a divisor of 0 divides by 1, as the printer does)."""
    total = size(ix.const, at)
    for atom, coef in ix.terms:
        if isinstance(atom, Var):
            value = env[atom]
        elif isinstance(atom, (Div, Mod)):
            x, k = index(atom.e, env, at), max(size(atom.k, at), 1)
            value = x // k if isinstance(atom, Div) else x % k
        else:
            assert isinstance(atom, Clamp)
            value = min(max(index(atom.e, env, at), size(atom.lo, at)), size(atom.hi, at))
        total += size(coef, at) * value
    return total


def points(vs: list[Var], at: dict[str, int]) -> list[dict[Var, int]]:
    ranges = [range(size(v.extent, at)) for v in vs]
    return [dict(zip(vs, p)) for p in itertools.product(*ranges)]


sizes = st.sampled_from([1, 2, 3, 4, 6, S0, S1, 2 * S0, S0 * S1, S0 + 1, 3 * S1])


@settings(max_examples=60, deadline=None)
@given(values, st.lists(sizes, min_size=1, max_size=3), st.lists(sizes, min_size=3, max_size=3),
       st.sampled_from([0, 1, 2, S0]), sizes)  # fmt: skip
def test_div_mod_exact_with_symbolic_sizes(
    at: dict[str, int], extents: list[Size], coefs: list[Size], const: Size, k: Size
) -> None:
    vs = [Var(f"i{j}", n) for j, n in enumerate(extents)]
    e = Ix.lit(const)
    for v, c in zip(vs, coefs):
        e = e + Ix.var(v) * c
    q, r = e.div(k), e.mod(k)
    kk = size(k, at)
    for env in points(vs, at):
        x = index(e, env, at)
        assert index(q, env, at) == x // kk
        assert index(r, env, at) == x % kk
        for got, (lo, hi) in ((index(q, env, at), q.range), (index(r, env, at), r.range)):
            assert lo is None or size(lo, at) <= got
            assert hi is None or got <= size(hi, at)


SHAPES = [
    ((S0, 3, S1), (3 * S0, S1)),
    ((S0, 3, S1), (S0, 3 * S1)),
    ((S0, S1, 4), (S0 * S1, 4)),
    ((2, S0, S1), (2 * S0 * S1,)),
    ((S0, 4), (S0, 2, 2)),
]


@settings(max_examples=40, deadline=None)
@given(values, st.sampled_from(SHAPES), st.booleans())
def test_symbolic_reshapes_fold_back_to_strides(
    at: dict[str, int], pair: tuple[tuple[Size, ...], tuple[Size, ...]], forward: bool
) -> None:
    """A view of a symbolic shape as another and back: the same element everywhere, and the
    div/mod of the reshape folds away (plain strides) wherever it does for static shapes."""
    a, b = pair if forward else pair[::-1]
    vs = [Var(f"i{j}", n) for j, n in enumerate(a)]
    idx = tuple(Ix.var(v) for v in vs)
    back = unravel(ravel(unravel(ravel(idx, a), b), b), a)
    for env in points(vs, at):
        assert [index(i, env, at) for i in back] == [env[v] for v in vs]
    # NOTE: the same views at sizes with no coincidences (distinct primes)
    primes = {"s0": 5, "s1": 7}
    sa, sb = (tuple(size(d, primes) for d in shape) for shape in (a, b))
    svs = [Var(f"i{j}", n) for j, n in enumerate(sa)]
    sidx = tuple(Ix.var(v) for v in svs)
    if unravel(ravel(unravel(ravel(sidx, sa), sb), sb), sa) == sidx:
        assert back == idx


polys = st.builds(
    lambda c0, c1, c2, c3: c0 + c1 * S0 + c2 * S1 + c3 * S0 * S1,
    st.integers(-8, 8), st.integers(-3, 3), st.integers(-3, 3), st.integers(-2, 2),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(polys, polys, values)
def test_proofs_hold_for_every_value(a: Size, b: Size, at: dict[str, int]) -> None:
    """What the prover proves is true at every value of the symbols (sizes are at least 1)."""
    va, vb = size(a, at), size(b, at)
    if nonneg(a):
        assert va >= 0
    if le(a, b):
        assert va <= vb
    if lt(a, b):
        assert va < vb
    lo = lower_bound(a)
    if lo is not None:
        assert lo <= va
    q = exact_quotient(a * b, b) if b != 0 else None
    if q is not None:
        assert size(q, at) * vb == va * vb
    assert size(a + b, at) == va + vb and size(a * b, at) == va * vb


@settings(max_examples=60, deadline=None)
@given(polys, values)
def test_sympy_round_trip(p: Size, at: dict[str, int]) -> None:
    back = from_dim(to_dim(p))
    assert back == p
    expr = to_dim(p)
    assert (expr if isinstance(expr, int) else int(expr.subs(_subs(at)))) == size(p, at)
    assert isinstance(p, (int, Poly))


def _subs(at: dict[str, int]) -> dict[object, int]:
    return {symbol(k): v for k, v in at.items()}


def test_poly_refuses_undecided_questions() -> None:
    import pytest

    with pytest.raises(TypeError, match="decided at run time"):
        bool(S0 - 2)
    with pytest.raises(TypeError, match="prove it"):
        _ = S0 < 3
    with pytest.raises(TypeError, match="no value before a call"):
        int(S0)
    assert (S0 + 1) - S0 == 1 and S0 * 0 == 0 and S0 != 1

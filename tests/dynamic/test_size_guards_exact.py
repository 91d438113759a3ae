"""Size comparisons through floor division, modulo and ceiling are guarded exactly: a program
that branches on ``(n - 10) // 3 == -1`` takes eager's branch at every size. The guards were
evaluated by ``sympy.lambdify``'s float code (``floor((1/3)*s1 - 10/3)``), whose rounding failed
the guard at n = 7 (a needless recompile) and passed it at n = 10, where eager takes the other
branch: the stale specialization was served."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import plait
from plait.symbolic.exact import exact_function
from tests.util import assert_bitwise

SIZES = (8, 7, 10, 11, 4, 9, 13, 6, 12, 5)

BRANCHES: dict[str, Callable[[int], bool]] = {
    "floordiv_negative": lambda n: (n - 10) // 3 == -1,
    "mod_negative": lambda n: (n - 10) % 3 == 1,
    "ceil_of_thirds": lambda n: math.ceil((n - 10) / 3) == 0,
    "floordiv_of_product": lambda n: (n * 7 - 50) // 7 == -1,
}


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("name", sorted(BRANCHES))
def test_branch_on_a_floor_division_follows_eager(name: str, dynamic: bool | None) -> None:
    cond = BRANCHES[name]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if cond(x.shape[1]) else x - 1

    compiled = plait.compile(fn, dynamic=dynamic, options={"cache": False, "recompile_limit": 20})
    for seed, n in enumerate(SIZES):
        torch.manual_seed(seed)
        x = torch.randn(3, n)
        assert_bitwise(compiled(x), fn(x), f"{name} at n={n}")


S = sympy.Symbol("s0", integer=True, positive=True)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(-40, 40),
    st.integers(1, 9).flatmap(lambda q: st.tuples(st.just(q), st.integers(-3 * q, 3 * q))),
    st.integers(-6, 6),
    st.sampled_from([sympy.floor, sympy.ceiling]),
)
def test_floor_and_ceiling_relations_evaluate_exactly(
    k: int, qm: tuple[int, int], c: int, rounding: object
) -> None:
    q, m = qm
    rel = sympy.Eq(rounding((k * S + m) / q), c)  # type: ignore[operator]
    fn = exact_function(rel, [S])
    for n in range(2, 60):
        assert bool(fn(n)) == bool(rel.subs(S, n)), (rel, n)

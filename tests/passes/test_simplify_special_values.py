"""Every arithmetic rewrite of the simplify pass, through ``plait.compile``, on NaN, +-0, +-inf.

Each pattern below is a program a simplify rule matches (or a near miss it must refuse: the zero of
the other sign, an alpha that is not 1). Hypothesis draws the input's values from NaN, +-0.0,
+-inf and random finite numbers; the compiled program must return eager's answer bit for bit
(the rewrites keep the order of arithmetic: every one fires only where it is an IEEE identity),
a NaN where eager has a NaN (IEEE leaves a new NaN's sign and payload to the hardware and the
kernel's instruction choice: x86's default NaN is negative, a folded one may not be).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import plait
from plait.passes.simplify import RULES
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)

SIZE = 8
INF = float("inf")
Program = Callable[[torch.Tensor], torch.Tensor]

# NOTE: (the rule it exercises, the program); the rule's name keeps the table honest below.
PATTERNS: list[tuple[str, str, Program]] = [
    ("simplify.add-zero", "x + 0.0", lambda x: x + 0.0),
    ("simplify.add-zero", "x + (-0.0)", lambda x: x + (-0.0)),
    ("simplify.add-zero", "x * -0.0 + 0.0", lambda x: x * (-0.0) + 0.0),
    ("simplify.add-zero", "add(x, 0.0, alpha=2)", lambda x: torch.add(x, 0.0, alpha=2.0)),
    ("simplify.add-zero", "add(x, -0.0, alpha=inf)", lambda x: torch.add(x, -0.0, alpha=INF)),
    ("simplify.zero-add", "0.0 + x", lambda x: 0.0 + x),
    ("simplify.zero-add", "-0.0 + x", lambda x: -0.0 + x),
    ("simplify.sub-zero", "x - 0.0", lambda x: x - 0.0),
    ("simplify.sub-zero", "x - (-0.0)", lambda x: x - (-0.0)),
    ("simplify.sub-zero", "sub(x, 0.0, alpha=3)", lambda x: torch.sub(x, 0.0, alpha=3.0)),
    ("simplify.mul-one", "x * 1.0", lambda x: x * 1.0),
    ("simplify.one-mul", "1.0 * x", lambda x: 1.0 * x),
    ("simplify.div-one", "x / 1.0", lambda x: x / 1.0),
    ("simplify.pow-one", "x ** 1.0", lambda x: x**1.0),
    ("simplify.double-neg", "-(-x)", lambda x: torch.neg(torch.neg(x))),
    ("simplify.cast-same-dtype", "x.float()", lambda x: x.float() * 2.0),
    ("simplify.cast-round-trip", "x.double().float()", lambda x: x.double().float()),
    ("simplify.cast-round-trip", "x.half().float()", lambda x: x.half().float()),
]

ARITHMETIC_RULES = {
    "simplify.add-zero",
    "simplify.zero-add",
    "simplify.sub-zero",
    "simplify.mul-one",
    "simplify.one-mul",
    "simplify.div-one",
    "simplify.pow-one",
    "simplify.double-neg",
    "simplify.cast-same-dtype",
    "simplify.cast-round-trip",
}

VALUES = st.one_of(
    st.sampled_from([float("nan"), 0.0, -0.0, float("inf"), float("-inf")]),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal bits everywhere but at NaNs, where both must be NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN at {got} vs eager {want}"
    keep = ~want.isnan()
    bits_got = got.contiguous().view(torch.int32)[keep]
    bits_want = want.contiguous().view(torch.int32)[keep]
    assert torch.equal(bits_got, bits_want), f"{what}: {got} vs eager {want}"


def test_every_arithmetic_rule_has_a_pattern() -> None:
    names = {r.name for r in RULES}
    assert names >= ARITHMETIC_RULES
    assert {rule for rule, _, _ in PATTERNS} == ARITHMETIC_RULES


_COMPILED: dict[str, Callable[..., torch.Tensor]] = {}


def _compiled(name: str, fn: Program) -> Callable[..., torch.Tensor]:
    """One compile per pattern (the input shape never changes, so nothing recompiles)."""
    if name not in _COMPILED:
        cf = plait.compile(fn, backend="stax")
        cf(torch.randn(SIZE))
        _COMPILED[name] = cf
    return _COMPILED[name]


@pytest.mark.slow
@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize(("rule", "name", "fn"), PATTERNS, ids=[p[1] for p in PATTERNS])
def test_rewrite_keeps_ieee_bits(rule: str, name: str, fn: Program) -> None:
    cf = _compiled(name, fn)

    @settings(max_examples=60, deadline=None, database=None)
    @given(st.lists(VALUES, min_size=SIZE, max_size=SIZE))
    def check(values: list[float]) -> None:
        x = torch.tensor(values, dtype=torch.float32)
        with torch.no_grad():
            assert_same_bits(cf(x.clone()), fn(x.clone()), f"{name} on {values}")

    check()

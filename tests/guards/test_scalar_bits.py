"""Scalar guards compare IEEE-754 bit patterns: after ``0.0`` a call with ``-0.0`` is a new
specialization (``==`` calls them equal; eager's results differ in sign), the same NaN holds its
specialization (``==`` never holds for a NaN, which recompiled every call until the limit), and
``inf``/``-inf`` are told apart, in the native evaluator and in the Python reads alike."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import plait
from plait.guards import native
from tests.util import assert_bitwise

NO_CACHE = {"cache": False}


def _scaled(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s * x


def _fresh() -> torch.Tensor:
    return torch.rand(4, 8) + 0.5  # NOTE: positive: the sign of x * s is the sign of s


def _check_evaluator(cf: Any, evaluator: str) -> None:
    for spec in cf.specializations:
        if evaluator == "python":
            assert spec.guards.evaluator.startswith("python")
        elif native.status().available:
            assert spec.guards.evaluator == "native"


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_negative_zero_after_zero_recompiles(evaluator: str, backend: str) -> None:
    cf = plait.compile(_scaled, backend=backend, options=NO_CACHE)
    x = _fresh()
    assert_bitwise(cf(x, 0.0), _scaled(x, 0.0))
    x = _fresh()
    out = cf(x, -0.0)
    want = _scaled(x, -0.0)
    assert torch.signbit(want).all()
    assert torch.signbit(out).all(), "-0.0 ran the 0.0 specialization"
    assert_bitwise(out, want)
    assert len(cf.specializations) == 2
    assert "s == 0.0" in cf.recompile_reasons[0] and "-0.0" in cf.recompile_reasons[0]
    x = _fresh()
    assert_bitwise(cf(x, 0.0), _scaled(x, 0.0))  # NOTE: the first holds again, no third
    assert len(cf.specializations) == 2
    _check_evaluator(cf, evaluator)


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_nan_scalar_compiles_once(evaluator: str, backend: str) -> None:
    cf = plait.compile(_scaled, backend=backend, options={**NO_CACHE, "recompile_limit": 2})
    for _ in range(4):
        x = _fresh()
        s = float("nan")  # NOTE: a new object each call: identity cannot decide
        out, want = cf(x, s), _scaled(x, s)
        assert out.isnan().all()
        assert_bitwise(out, want)
    assert len(cf.specializations) == 1, cf.recompile_reasons
    _check_evaluator(cf, evaluator)


def test_other_nan_bits_are_another_specialization(evaluator: str) -> None:
    cf = plait.compile(_scaled, backend="eager", options=NO_CACHE)
    assert math.copysign(1.0, -float("nan")) < 0
    for sign in (1.0, -1.0, 1.0, -1.0):
        x = _fresh()
        s = math.copysign(float("nan"), sign)
        assert_bitwise(cf(x, s), _scaled(x, s))
    assert len(cf.specializations) == 2, cf.recompile_reasons
    _check_evaluator(cf, evaluator)


@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_infinities(evaluator: str, backend: str) -> None:
    cf = plait.compile(_scaled, backend=backend, options=NO_CACHE)
    for text in ("inf", "-inf", "inf", "-inf", "1.0"):
        x = _fresh()
        s = float(text)
        assert_bitwise(cf(x, s), _scaled(x, s))
    assert len(cf.specializations) == 3, cf.recompile_reasons
    _check_evaluator(cf, evaluator)


def test_scalars_nested_in_containers_and_keywords(evaluator: str) -> None:
    def f(x: torch.Tensor, pair: tuple[float, float], *, shift: float = 1.0) -> torch.Tensor:
        return x * pair[0] * x * pair[1] * shift

    cf = plait.compile(f, options=NO_CACHE)
    calls = [((0.0, 1.0), 0.0), ((-0.0, 1.0), 0.0), ((0.0, 1.0), -0.0), ((0.0, 1.0), 0.0)]
    for pair, shift in calls:
        x = _fresh()
        assert_bitwise(cf(x, pair, shift=shift), f(x, pair, shift=shift))
    assert len(cf.specializations) == 3, cf.recompile_reasons
    _check_evaluator(cf, evaluator)


def test_complex_scalar_signed_zero(evaluator: str) -> None:
    def f(x: torch.Tensor, c: complex) -> torch.Tensor:
        return x * c.imag * x

    cf = plait.compile(f, options=NO_CACHE)
    for c in (complex(1.0, 0.0), complex(1.0, -0.0)):
        x = _fresh()
        out, want = cf(x, c), f(x, c)
        assert torch.equal(torch.signbit(out), torch.signbit(want))
        assert_bitwise(out, want)
    assert len(cf.specializations) == 2, cf.recompile_reasons

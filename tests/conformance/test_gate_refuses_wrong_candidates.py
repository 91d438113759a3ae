"""The gate refuses candidates that perturb eager's result: each wrong in one way, each judged
on the outputs alone (the gate must fail it, and by the named check)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait.conformance
from tests.util import contract_tol

_ATOL = contract_tol("model", torch.float32)["atol"]


def _f(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2


def _at(y: torch.Tensor, index: int, value: float) -> torch.Tensor:
    y = y.clone()
    y.view(-1)[index] = value
    return y


def _stale() -> Callable[[torch.Tensor], torch.Tensor]:
    seen: list[torch.Tensor] = []

    def candidate(x: torch.Tensor) -> torch.Tensor:
        if not seen:
            seen.append(_f(x))
        return seen[0].clone()

    return candidate


def _mutates(x: torch.Tensor) -> torch.Tensor:
    y = _f(x)
    x.add_(1)
    return y


def _scale_in_place(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x.sum()


def _scale_in_place_wrong(x: torch.Tensor) -> torch.Tensor:
    s = (x * 2).sum()
    x.mul_(3)
    return s


# (name, reference, candidate, check the gate must fail it by)
CASES: list[tuple[str, Callable[..., Any], Callable[..., Any], str]] = [
    ("nan_where_finite", _f, lambda x: _at(_f(x), 5, float("nan")), "nonfinite"),
    ("finite_where_nan", torch.log, lambda x: torch.log(x.abs()), "nonfinite"),
    ("minus_inf_for_inf", lambda x: x / 0, lambda x: -x.abs() / 0, "nonfinite"),
    ("ten_atol_one_element", _f, lambda x: _at(_f(x), 5, float(_f(x).view(-1)[5]) + 10 * _ATOL),
     "tolerance"),
    ("error_on_zero_reference", lambda x: x * 0, lambda x: _at(x * 0, 3, 10 * _ATOL), "tolerance"),
    ("int_off_by_one", lambda x: (x > 0).sum(0), lambda x: (x > 0).sum(0) + (torch.arange(64) == 3),
     "exact"),
    ("bool_flipped", lambda x: x > 0, lambda x: (x > 0) ^ (torch.arange(64) == 3), "exact"),
    ("wrong_dtype", _f, lambda x: _f(x).double(), "dtype"),
    ("shape_that_broadcasts", lambda x: x.sum().expand(4).clone(), lambda x: x.sum().reshape(1),
     "shape"),
    ("stale_first_draw", _f, _stale(), "tolerance"),
    ("mutates_its_input", _f, _mutates, "tolerance"),
    ("wrong_in_place_mutation", _scale_in_place, _scale_in_place_wrong, "tolerance"),
    ("view_where_eager_copies", lambda x: x.clone(), lambda x: x.view_as(x), "alias"),
    ("float32_where_eager_bfloat16", lambda x: _f(x.bfloat16()), lambda x: _f(x.float()), "dtype"),
    ("bfloat16_rounded_where_eager_float32", _f, lambda x: _f(x).bfloat16().float(), "tolerance"),
    # the gate passed these before the structure check and the scalar type check
    ("tuple_for_list", lambda x: (_f(x), x + 1), lambda x: [_f(x), x + 1], "structure"),
    ("extra_tuple_output", lambda x: (_f(x),), lambda x: (_f(x), x + 1), "structure"),
    ("extra_dict_key", lambda x: {"a": _f(x)}, lambda x: {"a": _f(x), "b": x + 1}, "structure"),
    ("zeros_where_eager_none", lambda x: (_f(x), None), lambda x: (_f(x), torch.zeros(3)),
     "structure"),
    ("int_where_eager_bool", lambda x: (_f(x), True), lambda x: (_f(x), 1), "value"),
    ("int_where_eager_float", lambda x: (_f(x), 1.0), lambda x: (_f(x), 1), "value"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "reference", "candidate", "check"), CASES, ids=[c[0] for c in CASES]
)
def test_gate_refuses(
    name: str, reference: Callable[..., Any], candidate: Callable[..., Any], check: str
) -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    report = plait.conformance.check(reference, candidate, (x,), stress=None)
    assert not report.ok, f"{name} passed:\n{report}"
    assert any(f.check == check for f in report.errors), f"{name} not caught by {check}:\n{report}"


def test_signed_zero_refused_under_bitwise() -> None:
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    report = plait.conformance.check(lambda t: t * 0, lambda t: (t * 0).abs(), (x,), bitwise=True)
    assert not report.ok and any(f.check == "bitwise" for f in report.errors), str(report)


def test_copy_where_eager_returns_a_view_is_a_warning_only() -> None:
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))
    report = plait.conformance.check(lambda t: t[1:], lambda t: t[1:].clone(), (x,))
    assert report.ok and any(f.check == "alias" for f in report.warnings), str(report)


def test_same_structure_and_scalars_still_pass() -> None:
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(3))

    def program(t: torch.Tensor) -> Any:
        return [_f(t), {"n": 2, "s": 1.5, "b": True, "none": None}]

    assert plait.conformance.check(program, program, (x,)).ok


@pytest.mark.parametrize("position", [40, -40], ids=["positive", "negative"])
def test_a_lone_index_baked_from_the_example_is_refused(position: int) -> None:
    """An integer input of one value (a decoding position) draws other values: a candidate that
    kept the example's row passed every draw while all draws repeated that one value."""
    table = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))

    def reference(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return t[i] * 2

    def baked(t: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return t[torch.full_like(i, position)] * 2

    example = (table, torch.tensor([position]))
    report = plait.conformance.check(reference, baked, example, stress=None)
    assert not report.ok and any(f.check == "tolerance" for f in report.errors), str(report)
    assert plait.conformance.check(reference, reference, example, stress=None).ok

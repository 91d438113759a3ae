"""How the gate judges values: NaN/Inf positions, the contract's tolerances, the float64 anchor,
the bitwise rule, structure and dtypes, and what the report says."""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch
from torch import nn

import plait.conformance
import plait.contract
from plait.conformance import check
from tests.conformance.correct import mlp_split_k
from tests.conformance.models import MLP, ConvPool, randn, seeded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def loose_contract(scale: float) -> plait.contract.Contract:
    """The shipped contract with every float budget multiplied by ``scale`` (tests only)."""
    data: dict[str, Any] = tomllib.loads(plait.contract.default_text())
    for rows in data["op"].values():
        for dtype in plait.contract.FLOAT_DTYPES:
            rows[dtype]["rtol"] *= scale
            rows[dtype]["atol"] = rows[dtype]["atol"] * scale + scale
    return plait.contract.from_data(data, source="loose")


def nan_at_corner(x: torch.Tensor) -> torch.Tensor:
    out = x * 2
    out[0, 0] = float("nan")
    return out


def test_nan_where_the_reference_is_finite_fails_whatever_the_tolerances() -> None:
    x = randn(4, 5, seed=1)
    report = check(lambda t: t * 2, nan_at_corner, (x,), contract=loose_contract(1e6))
    assert not report.ok
    (failure, *_) = [f for f in report.errors if f.check == "nonfinite"]
    assert failure.index == (0, 0) and failure.where == "output"
    assert failure.expected is not None and failure.actual != failure.actual  # NaN
    # NOTE: and the looser-than-shipped contract is itself reported, as a warning.
    assert any(f.check == "contract" and f.severity == "warning" for f in report.failures)


def test_inf_must_match_in_sign() -> None:
    x = randn(3, 3, seed=2).abs() + 1

    def ref(t: torch.Tensor) -> torch.Tensor:
        return torch.log(t - t)  # NOTE: log(0) = -inf everywhere.

    report = check(ref, lambda t: -torch.log(t - t), (x,))
    assert report.caught("output", "nonfinite")
    assert check(ref, ref, (x,)).ok


def test_elementwise_budget_comes_from_the_op_class() -> None:
    # NOTE: the split-K candidate is a correct float32 model, but data movement must be exact.
    setup = mlp_split_k()
    ok = check(setup.reference, setup.candidate, setup.inputs, **setup.options)
    assert ok.ok, str(ok)
    strict = check(
        setup.reference, setup.candidate, setup.inputs, op_class="data_movement", **setup.options
    )
    assert strict.caught("output", "tolerance")
    (failure, *_) = strict.errors
    assert failure.budget is not None and failure.error is not None
    assert failure.error > failure.budget
    # NOTE: an exact row is never ill-conditioned (eager's rounding against float64 says only
    # that the program rounds): every draw is judged elementwise, not only the stress draw
    assert not failure.case.startswith("stress")
    assert strict.checks_run["tolerance (ill-conditioned: anchored)"] == 0


def test_bitwise_claim_is_held_to_bitwise_equality() -> None:
    setup = mlp_split_k()
    model = setup.reference
    assert check(model, model, setup.inputs, bitwise=True).ok
    report = check(model, setup.candidate, setup.inputs, bitwise=True, **setup.options)
    assert report.caught("output", "bitwise")


def test_anchor_catches_what_the_elementwise_budget_cannot() -> None:
    # NOTE: a 3e-6 relative error sits inside the model budget but far outside eager's accuracy.
    model = seeded(1, MLP)
    tol = plait.contract.load().tolerance("model", "float32")
    drift = tol.rtol / 30
    report = check(
        model, lambda x: model(x) * (1 + drift), (randn(8, 16, seed=3),), candidate_module=model
    )
    assert report.caught("output", "anchored")
    assert not report.caught("output", "tolerance")


def test_the_tail_rule_catches_one_element_the_rms_dilutes() -> None:
    # NOTE: 4096 outputs, one of them off by 32 ulps of the largest value: the RMS error moves
    # little, the worst error exceeds the tail factor, the elementwise budget sees nothing.
    model = seeded(1, lambda: nn.Linear(64, 64))

    def candidate(x: torch.Tensor) -> torch.Tensor:
        y = model(x)
        bump = torch.zeros_like(y)
        bump[0, 0] = 64 * 2.0**-24 * float(y.detach().abs().max())
        return y + bump

    # NOTE: on the special-values draw the bump would be NaN (the largest value is): not this test
    x = randn(64, 64, seed=13)
    report = check(model, candidate, (x,), candidate_module=model, special_values=False)
    assert report.caught("output", "anchored") and not report.caught("output", "tolerance")
    (stat,) = [a for where, a in report.anchored.items() if where.startswith("output")]
    rms_share, tail_share = stat.shares
    assert rms_share < 1 < tail_share, (rms_share, tail_share)
    assert all("tail factor" in f.message for f in report.errors)


def test_the_baseline_is_the_least_accurate_of_eagers_layouts() -> None:
    # NOTE: PyTorch's channels_last float32 convolution rounds differently (less accurately here)
    # than its NCHW one; the baseline takes eager in both layouts, on the same inputs.
    model = seeded(6, ConvPool).eval()
    report = check(model, model, (randn(4, 3, 12, 12, seed=14),), grads=True)
    assert report.ok
    stats = [a for where, a in report.anchored.items() if where.startswith("output")]
    assert stats and all(a.rms_baseline >= a.rms_eager for a in stats)
    assert any(a.baseline_from == "eager, layout channels_last" for a in report.anchored.values())
    data = tomllib.loads(plait.contract.default_text())
    data["model"]["baseline_layouts"] = []
    alone = check(
        model, model, (randn(4, 3, 12, 12, seed=14),), contract=plait.contract.from_data(data)
    )
    assert all(a.baseline_from == "eager" for a in alone.anchored.values())
    assert all(a.rms_baseline == a.rms_eager for a in alone.anchored.values())


def test_without_anchor_the_gate_says_so() -> None:
    model = seeded(1, MLP)
    fn = lambda x: model(x)  # NOTE: closes over float32 weights: cannot run in float64.
    report = check(fn, fn, (randn(8, 16, seed=4),), candidate_module=model, reference_module=model)
    assert report.ok
    assert any("float64 anchor unavailable" in n for n in report.notes)
    assert report.checks_run["anchored"] == 0
    wide = copy.deepcopy(model).double()
    anchored = check(
        fn, fn, (randn(8, 16, seed=4),), reference_module=model, candidate_module=model,
        reference64=wide,
    )  # fmt: skip
    assert anchored.ok and anchored.checks_run["anchored"] > 0


def test_an_anchor_that_fails_on_the_stress_draw_only_keeps_the_other_draws_anchored() -> None:
    model = seeded(1, MLP)
    wide = copy.deepcopy(model).double()

    def fn(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float64:
            return model(x)
        if float(x.abs().max()) > 50:
            raise ValueError("out of range")  # NOTE: the float64 run of the stress draw only
        return wide(x)

    # NOTE: two devices (both the CPU): the stress draw of the first comes before the second's
    report = check(fn, fn, (randn(8, 16, seed=4),), candidate_module=model, reference_module=model,
                   devices=("cpu", "cpu"))  # fmt: skip
    assert report.ok, str(report)
    assert any(n.startswith("float64 anchor unavailable in the stress draw") for n in report.notes)
    assert report.anchored["output (layout contiguous, device cpu)"].draws == 8


def test_structure_dtype_and_shape_mismatches() -> None:
    x = randn(4, 4, seed=5)
    pair = lambda t: (t + 1, {"sum": t.sum(0)})
    assert check(pair, pair, (x,)).ok
    swapped = lambda t: (t + 1, {"total": t.sum(0)})
    assert check(pair, swapped, (x,)).caught("output[1]['sum']", "structure")
    assert check(lambda t: t + 1, lambda t: (t + 1).double(), (x,)).caught("output", "dtype")
    assert check(lambda t: t + 1, lambda t: (t + 1)[:3], (x,)).caught("output", "shape")
    assert check(lambda t: t + 1, lambda t: [t + 1], (x,)).caught("output", "structure")


def test_integer_outputs_are_exact() -> None:
    x = randn(6, 9, seed=6)
    report = check(lambda t: t.argmax(-1), lambda t: t.argmax(-1).clamp(max=7), (x,), draws=6)
    assert report.caught("output", "exact")
    assert check(lambda t: t.argmax(-1), lambda t: t.argmax(-1), (x,)).ok


def test_report_is_readable() -> None:
    model = seeded(1, MLP)
    wrong = lambda x: model(x) + 1e-3
    report = check(model, wrong, (randn(8, 16, seed=7),), candidate_module=model)
    text = str(report)
    assert text.startswith("conformance FAILED")
    assert "output @ example, layout contiguous, device cpu" in text
    assert "expected" in text and "budget" in text and "index" in text
    failure = report.errors[0]
    assert failure.severity == "error" and failure.index is not None
    assert failure.expected is not None and failure.actual is not None
    with pytest.raises(plait.conformance.ConformanceError) as caught:
        report.raise_if_failed()
    assert caught.value.report is report
    assert str(check(model, model, (randn(8, 16, seed=7),))).startswith("conformance PASSED")


def test_candidate_that_raises_is_a_failure_not_a_crash() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("kernel launch failed")

    report = check(lambda x: x + 1, broken, (randn(3, 3, seed=8),))
    assert report.caught("candidate", "exception")
    assert "kernel launch failed" in str(report)


def test_reference_that_raises_is_a_setup_failure() -> None:
    def picky(x: torch.Tensor) -> torch.Tensor:
        if bool((x > 10).any()):
            raise ValueError("out of domain")
        return x

    report = check(picky, picky, (randn(3, 3, seed=9),))
    assert report.caught("stress draw", "setup")

"""Compile budgets (options={"budgets": ...}), the per-node cost estimate in the manifest, and
the break-even of a specialization."""

from __future__ import annotations

import math

import pytest
import torch

import plait
import plait.diagnose
from plait.cost import Budgets, estimate
from plait.errors import PerformanceRegressionError, PerformanceWarning, code_of
from plait.ir import GraphBuilder, TensorType


def _compiled(**budgets: object) -> object:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    options = {"cache": False, **({"budgets": budgets} if budgets else {})}
    return plait.compile(model, options=options)


def test_the_manifest_carries_the_cost_of_every_node() -> None:
    compiled = _compiled()
    with torch.no_grad():
        compiled(torch.randn(2, 3, 10, 10))
    cost = compiled.specializations[0].manifest.graph["cost"]  # type: ignore[attr-defined]
    conv = next(n for n in cost["nodes"] if n["op"] == "conv2d")
    assert conv["flops"] == 2 * (2 * 8 * 8 * 8) * 3 * 3 * 3  # NOTE: 2 per multiply-add
    assert cost["flops"] == sum(n["flops"] for n in cost["nodes"]) and cost["bytes"] > 0


def test_views_move_nothing_and_symbolic_shapes_are_not_guessed() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6), torch.float32))
    gb.output(gb.call("exp", gb.call("transpose", x, dim0=0, dim1=1)))
    cost = estimate(gb.build())
    assert [(c.flops, c.bytes) for c in cost.nodes.values()] == [(0, 0), (8 * 24, 2 * 96)]


def test_a_missed_budget_raises_or_warns_as_asked() -> None:
    with torch.no_grad(), pytest.raises(PerformanceRegressionError) as raised:
        _compiled(passes_s=0.0, on_miss="raise")(torch.randn(1, 3, 8, 8))  # type: ignore[operator]
    assert "passes_s" in str(raised.value)
    assert code_of(raised.value).code == "PLAIT-P400"  # type: ignore[union-attr]
    compiled = _compiled(memory_bytes=1)
    with torch.no_grad(), pytest.warns(PerformanceWarning, match="memory_bytes"):
        compiled(torch.randn(1, 3, 8, 8))  # type: ignore[operator]
    timings = compiled.specializations[0].manifest.timings  # type: ignore[attr-defined]
    assert timings["budget.memory_bytes"] == 1


def test_budgets_are_off_by_default_and_checked_when_given() -> None:
    assert Budgets.of(None) is None
    generous = _compiled(compile_s=3600.0, memory_bytes=1 << 40)
    with torch.no_grad():
        generous(torch.randn(1, 3, 8, 8))  # type: ignore[operator]
    with pytest.raises(ValueError, match="unknown budgets"):
        Budgets.of({"passes": 1.0})
    with pytest.raises(ValueError, match="on_miss"):
        Budgets.of({"on_miss": "ignore"})


def test_break_even_weighs_the_compile_against_the_saving() -> None:
    compiled = _compiled()
    report = plait.diagnose.break_even(compiled, (torch.randn(1, 3, 16, 16),), calls=3)
    assert report.compile_s > 0 and report.eager_s > 0 and report.compiled_s > 0
    expected = report.compile_s / report.saving_s if report.saving_s > 0 else math.inf
    assert report.calls_to_break_even == expected


def test_explain_prints_the_measured_break_even() -> None:
    compiled = _compiled()
    args = (torch.randn(1, 3, 16, 16),)
    with torch.no_grad():
        compiled(*args)  # type: ignore[operator]
    assert "break-even: not measured" in str(plait.explain(compiled))
    report = plait.diagnose.break_even(compiled, args, calls=3)
    text = str(plait.explain(compiled))
    assert f"break-even: {report} (medians of 3 calls)" in text, text
    assert "not measured" not in text

"""The recompile limit (a clear error, or a recorded eager fallback: never silent), plait.explain
listing specializations and their reasons, and the guard fast path's shape for a ResNet."""

from __future__ import annotations

import timeit

import pytest
import torch

import plait
from benchmarks.models.resnet import resnet18
from plait.errors import CaptureFallbackWarning, RecompileLimitError
from plait.guards import GuardEnv


def add(x: torch.Tensor, n: int) -> torch.Tensor:
    return x + n


def test_limit_raises_by_default_naming_the_guard() -> None:
    f = plait.compile(add, backend="eager", options={"recompile_limit": 2, "cache": False})
    x = torch.randn(3)
    f(x, 1)
    f(x, 2)
    with pytest.raises(RecompileLimitError, match=r"recompile limit \(2 .*n == 2: expected 2"):
        f(x, 3)
    assert f(x, 1).equal(x + 1)  # existing specializations still serve


def test_limit_eager_fallback_warns_once_and_is_recorded() -> None:
    f = plait.compile(
        add,
        backend="eager",
        options={"recompile_limit": 1, "on_recompile_limit": "eager", "cache": False},
    )
    x = torch.randn(3)
    f(x, 1)
    with pytest.warns(CaptureFallbackWarning, match="recompile limit"):
        assert f(x, 5).equal(x + 5)
    assert f(x, 6).equal(x + 6)  # NOTE: warned once; the next calls are counted, not warned
    report = plait.explain(f)
    assert report.limit_fallback is not None and report.limit_fallback["calls"] == 2
    assert "n == 1: expected 1 (int), got 5 (int)" in report.limit_fallback["reason"]
    assert "eager fallback past the recompile limit (2 call(s))" in str(report)
    assert report.to_json()["limit_fallback"]["calls"] == 2
    assert len(f.specializations) == 1


def test_bad_limit_option_is_refused() -> None:
    with pytest.raises(ValueError, match="on_recompile_limit"):
        plait.compile(add, options={"on_recompile_limit": "ignore"})
    with pytest.raises(ValueError, match="options\\['cache'\\]"):
        plait.compile(add, options={"cache": 3})


def test_explain_lists_specializations_with_reasons_and_cache_status(tmp_path) -> None:
    f = plait.compile(add, backend="eager", options={"cache": str(tmp_path)})
    x = torch.randn(3)
    f(x, 1)
    f(x.double(), 1)
    report = plait.explain(f)
    assert [s.reason is None for s in report.specializations] == [True, False]
    reason = report.specializations[1].reason
    assert reason is not None and "expected f32[3] on cpu, got f64[3] on cpu" in reason
    text = str(report)
    assert "recompiled: x: f32[3]" in text and "cache: miss" in text
    assert report.specializations[0].manifest.cache_key["digest"]
    # NOTE: what checks the guards is reported; on a machine with a C++ compiler, the native
    # evaluator (a failed build would say "python: <why>" here, and this test would fail).
    evaluator = report.specializations[0].guard_evaluator
    assert evaluator == f.specializations[0].guards.evaluator == "native", evaluator
    assert "checked by the native evaluator" in text
    assert report.to_json()["specializations"][0]["guard_evaluator"] == "native"


def test_resnet_guard_fast_path_is_batched() -> None:
    """The fast path of a frozen ResNet-18 reads the state in a few batch guards, not one guard
    per tensor (the per-call cost, in microseconds, is in benchmarks/RESULTS.md)."""
    model = resnet18(num_classes=10).eval()
    x = torch.randn(1, 3, 16, 16)
    f = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        f(x)
        engine = f._plait
        spec = engine.specializations[0]
        env = GuardEnv(*engine.adapter.flatten((x,), {})[:2], model, engine.fetch())
        assert spec.guards.holds(env)
        assert len(spec.manifest.graph["frozen"]) > 100
        # NOTE: one guard each: structure, identity of the inputs, types, ambient settings ...
        assert len(spec.guards._fast) <= 13, [g.text for g in spec.guards if not g.redundant]
        per_call = min(timeit.repeat(lambda: spec.guards.holds(env), number=200, repeat=3)) / 200
    assert per_call < 1e-3  # NOTE: a loose bound for loaded CI machines; see RESULTS.md

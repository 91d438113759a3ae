"""The model-zoo benchmark (benchmarks/zoo.py, ``plait bench zoo``) in its quick mode.

Tiny Hugging Face models built from configs run through eager and plait (and ONNX Runtime when it
is installed): the report must have its structure, plait's coverage must come from its manifest,
parity must be the conformance gate's verdict under the shipped contract, a forced parity failure
must fail the run, and a system that cannot run must leave its error in its cell.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers  # noqa: F401  (a dev dependency: installed wherever the tests run)
from click.testing import CliRunner

import plait.contract
import plait.errors
from benchmarks import zoo, zoo_models, zoo_report, zoo_systems
from plait.cli import main as plait_main
from plait.progress import Progress

MODELS = ("hf-resnet50", "hf-bert-base")
COVERAGE = {"whole", "partial", "fallback"}


def _systems() -> tuple[str, ...]:
    extra = ("onnxruntime",) if zoo_systems.unavailable("onnxruntime") is None else ()
    return ("eager", "plait", *extra)


def _run(**kw: Any) -> dict[str, Any]:
    cfg = zoo.ZooConfig.preset(True, threads=(1,), repeats=2, warmup=1, **kw)
    return zoo.run(cfg, Progress("quiet"))


@pytest.mark.slow
def test_quick_run_reports_coverage_parity_compile_and_latency_per_model() -> None:
    result = _run(models=MODELS, systems=_systems())
    json.dumps(result, allow_nan=False)  # NOTE: the JSON file must be strict JSON.
    assert result["benchmark"] == "zoo" and result["config"]["quick"] is True
    assert [m["name"] for m in result["models"]] == list(MODELS)
    contract = plait.contract.load().version
    for m in result["models"]:
        assert m["status"] == "ran" and m["parameters"] > 0, m
        assert set(m["systems"]) == set(_systems())
        cov = m["plait"]
        assert cov["status"] in COVERAGE and cov["specializations"] >= 1
        if cov["status"] == "fallback":
            assert any(f.startswith("whole program: ") for f in cov["fallbacks"]), cov
        else:
            assert 0.0 < cov["compiled_share"] <= 1.0 and sum(cov["counts"].values()) > 0
        for kind, s in m["systems"].items():
            assert s["available"] and s["error"] is None, (m["name"], kind, s["error"])
            lat = s["latency"]["1"]
            assert lat["samples"] == 2 and lat["p50_ms"] > 0
            if kind == "eager":
                assert s["gate"] is None and lat["speedup_vs_eager_p50"] == 1.0
                continue
            gate = s["gate"]  # NOTE: parity is judged, by the gate, under the shipped contract.
            ok = gate["ok"] and gate["contract"] == contract and gate["checks"] > 0
            assert ok, (m["name"], kind, [f.get("message", f) for f in gate.get("failures", [])])
            assert s["compile"]["cold_s"] > 0 and s["vs_eager"]["max_abs"] >= 0
    assert result["verdict"]["exit_code"] == 0 and result["verdict"]["parity_ok"]
    md = zoo_report.markdown(result)
    assert "## Coverage and parity" in md and "## Steady state, 1 thread(s)" in md
    assert all(f"| {name} |" in md for name in MODELS)


@pytest.mark.slow
def test_a_wrong_plait_answer_fails_the_run(tmp_path: Path) -> None:
    out = tmp_path / "zoo.json"
    args = ["--quick", "--models", "hf-resnet50", "--systems", "eager,plait", "--threads", "1",
            "--repeats", "1", "--progress", "quiet", "--json", str(out),
            "--markdown", str(tmp_path / "zoo.md"), "--perturb-plait", "0.01"]  # fmt: skip
    res = CliRunner().invoke(zoo.main, args)
    assert res.exit_code == 1, res.output
    result = json.loads(out.read_text())
    gate = result["models"][0]["systems"]["plait"]["gate"]
    assert not gate["ok"] and gate["errors"] > 0
    assert result["verdict"]["plait_failures"][0].startswith("hf-resnet50: ")
    assert "**plait parity: FAILED**" in (tmp_path / "zoo.md").read_text()


def test_a_system_that_cannot_run_keeps_its_error_in_its_cell() -> None:
    module, example = torch.nn.Linear(4, 2).eval(), torch.randn(3, 4)
    broken = zoo_systems.OnnxFile(error="dynamo: RuntimeError: unsupported operator")
    runner = zoo_systems.Runner("onnxruntime", module, example, broken)
    runner.prepare(1)
    assert runner.error is not None and "unsupported operator" in runner.error
    record = zoo.ModelRun._system_record(runner)
    assert record["available"] is False and record["gate"] is None
    assert record["latency"] == {}


def test_a_source_that_does_not_import_is_skipped_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(zoo_models.model_sources, "use_torchvision", lambda: None)
    zoo_models.source_problem.cache_clear()
    try:
        problem = zoo_models.source_problem("timm")
        assert problem is not None and "model_sources fetch" in problem
        record = zoo.ModelRun(
            zoo.ZooConfig.preset(True, models=("timm-resnet50",)),
            zoo_models.entry("timm-resnet50"),
            Path("."),
        )
        rec = record.run(Progress("quiet"))
        assert rec["status"] == "skipped" and rec["reason"] == problem and rec["systems"] == {}
    finally:
        zoo_models.source_problem.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "tv-mobilenet-v3-large",
        "tv-vit-b-16",
        "timm-vit-small",
    ],
)
def test_torchvision_and_timm_models_compile_and_pass_the_gate(name: str) -> None:
    """The setup fetches torchvision's model definitions and installs timm: their models are
    measured here, never skipped."""
    _compile_and_gate(name)


@pytest.mark.slow
def test_mobilenet_v3_passes_the_gate_at_two_threads() -> None:
    """At two threads (CI runs one) the stress draw's logits of this model are ill-conditioned:
    its squeeze-excite gates amplify rounding beyond the elementwise budget there, eager's own
    logits are outside it against float64, and contract 1.2.0, which judged the stress draw
    elementwise, failed plait (tests/conformance/test_compiled_at_two_threads.py says more)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = _compile_and_gate("tv-mobilenet-v3-large")
    finally:
        torch.set_num_threads(before)
    (judged,) = report.judged
    assert judged.settings["torch.get_num_threads()"] == 2


def _compile_and_gate(name: str) -> plait.conformance.Report:
    m = zoo_models.entry(name)
    assert zoo_models.source_problem(m.source) is None
    built = zoo_models.build(m, quick=True, seed=0)
    compiled = plait.compile(built.module, backend="stax")
    with torch.no_grad(), warnings.catch_warnings():
        # NOTE: opaque nodes are announced (a CaptureFallbackWarning); the zoo reports their share
        warnings.simplefilter("ignore", plait.errors.CaptureFallbackWarning)
        report = plait.conformance.check(
            built.module, compiled, (built.example,), candidate_module=built.module,
            op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    (spec,) = compiled.specializations
    assert spec.program.fallback_reason is None
    return report


def test_a_model_run_gives_back_the_callers_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: a run sets the configuration's thread count; a test after it ran at one thread, so
    # plait.conformance judged at 1 what it meant to judge at the caller's count
    before = torch.get_num_threads()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no such layer")

    monkeypatch.setattr(zoo_models, "build", broken)
    cfg = zoo.ZooConfig.preset(True, models=("hf-resnet50",), threads=(before + 1,))
    rec = zoo.ModelRun(cfg, zoo_models.entry("hf-resnet50"), Path(".")).run(Progress("quiet"))
    assert rec["status"] == "skipped" and "no such layer" in rec["reason"]
    assert torch.get_num_threads() == before


def test_quick_models_build_small_and_full_inputs_have_the_documented_shapes() -> None:
    for name in zoo_models.QUICK_DEFAULT:
        m = zoo_models.entry(name)
        built = zoo_models.build(m, quick=True, seed=0)
        assert built.parameters < 1_000_000
        with torch.no_grad():
            y = built.module(built.example)
        assert isinstance(y, torch.Tensor) and torch.isfinite(y).all()
        expected = (1, zoo_models.QUICK_TOKENS) if m.family == "text" else (1, 3, 32, 32)
        assert tuple(built.example.shape) == expected


def test_plait_bench_zoo_is_the_zoo_command() -> None:
    res = CliRunner().invoke(plait_main, ["bench", "zoo", "--help"])
    assert res.exit_code == 0, res.output
    assert "Model zoo, CPU inference" in res.output and "--quick" in res.output
    bad = CliRunner().invoke(plait_main, ["bench", "zoo", "--models", "no-such-model"])
    assert bad.exit_code == 2 and "unknown zoo model" in bad.output


@pytest.mark.parametrize(
    "name", ["benchmarks.zoo_models", "benchmarks.zoo_systems", "benchmarks.zoo_report"]
)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0

"""The ResNet classification benchmark (benchmarks/resnet_classification.py, ``plait bench``).

The quick configuration runs end to end in a fresh process and its JSON must match the schema,
with parity fields that come from the conformance gate; a forced parity failure must exit 1.
"""

from __future__ import annotations

import doctest
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import plait.contract
from benchmarks.bench import config, report, timing
from benchmarks.bench.systems import plait_options
from plait.cli import main as plait_main

ROOT = Path(__file__).resolve().parents[1]
BENCH_MODULES = [
    "benchmarks.bench.config",
    "benchmarks.bench.data",
    "benchmarks.bench.parity",
    "benchmarks.bench.report",
    "benchmarks.bench.systems",
    "benchmarks.bench.timing",
    "benchmarks.bench.worker",
]


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), PLAIT_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "benchmarks.resnet_classification", "--quick", "--json", str(out)]
    cmd += ["--progress", "plain", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_quick_run_matches_the_schema_and_parity_comes_from_the_gate(tmp_path: Path) -> None:
    import jsonschema

    md, png = tmp_path / "out.md", tmp_path / "out.png"
    proc, result = _bench(
        tmp_path,
        "--repeats", "2", "--parity-images", "4",
        "--ablations", "fold-bn,freeze,fusion",
        "--markdown", str(md), "--chart", str(png),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    jsonschema.validate(result, report.schema())
    assert result["verdict"] == {
        "parity_ok": True,
        "plait_failures": [],
        "plait_errors": [],
        "other_gate_failures": [],
        "exit_code": 0,
    }
    contract = plait.contract.load().version
    (row,) = [r for r in result["results"] if r["system"] == "plait"]
    gate = row["parity"]["gate"]
    assert gate["ok"] and gate["contract"] == contract and gate["checks"] > 0
    assert row["codegen"]["counts"]["native"] > 0 and row["codegen"]["frozen"] > 0
    assert row["parity"]["display"]["top1_agreement_vs_eager"] == 1.0
    plait_sys = next(s for s in result["systems"] if s["name"] == "plait")
    assert plait_sys["compile"]["cold"]["first_call_s"] > 0
    warm = plait_sys["compile"]["warm"]["codegen"]
    assert warm["kernels_cached"] == warm["kernels"]  # NOTE: the warm process rebuilt nothing.
    variants = {a["name"]: a for a in result["ablations"]["variants"]}
    # a StaxOptions knob: measured, never reported as a made-up number
    assert variants["fusion"]["available"] is True and variants["fusion"]["latency"] is not None
    assert variants["fold-bn"]["parity"]["gate"]["ok"]
    (trained,) = [t for t in result["training"]["systems"] if t["kind"] == "plait"]
    assert trained["executors"]["statement"] is None  # NOTE: the backward was compiled
    assert trained["executors"]["backward"].startswith("stax backward program")
    assert trained["state_after_steps"]["within_contract"]
    assert trained["gate"]["ok"] and trained["gate"]["contract"] == contract
    assert "| plait | 2 |" in md.read_text() and png.stat().st_size > 0


@pytest.mark.slow
def test_a_forced_parity_failure_exits_nonzero(tmp_path: Path) -> None:
    proc, result = _bench(
        tmp_path,
        "--perturb-plait", "1e-3", "--no-compile-workers", "--ablations", "none",
        "--train-steps", "0", "--repeats", "1", "--parity-images", "2",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "FAILED: plait batch 2" in proc.stderr
    assert result["verdict"]["parity_ok"] is False and result["verdict"]["exit_code"] == 1
    (row,) = [r for r in result["results"] if r["system"] == "plait"]
    assert not row["parity"]["gate"]["ok"] and row["parity"]["gate"]["failures"]
    assert row["parity"]["display"]["vs_eager"]["max_abs"] > 0


def test_plait_bench_has_help() -> None:
    result = CliRunner().invoke(plait_main, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: plait bench" in result.output and "--quick" in result.output
    assert "--perturb-plait" not in result.output


def test_bad_options_are_usage_errors() -> None:
    result = CliRunner().invoke(plait_main, ["bench", "--systems", "plait,inductor"])
    assert result.exit_code == 2 and "must include eager" in result.output


@pytest.mark.parametrize("module", ["training_step", "training_cuda"])
def test_training_benchmarks_name_an_unknown_case_or_system(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = importlib.import_module(f"benchmarks.{module}")
    for argv, named in (
        (["--cases", "gpt2-block"], "unknown case gpt2-block"),
        (["--systems", "eager,torch.compile"], "unknown system torch.compile"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
        assert named in capsys.readouterr().err


def test_interleave_runs_turns_of_consecutive_calls_opened_by_untimed_ones() -> None:
    import torch

    from benchmarks.bench import run, systems
    from plait.progress import Progress

    events: list[str] = []
    group = [
        systems.System(k, k, "cpu", torch.nn.Identity(), lambda x, k=k: events.append(k))
        for k in ("a", "b")
    ]
    batches = [torch.randn(2)] * 5  # NOTE: 1 warm-up, then turns of 3 and 1 timed calls
    samples = run.interleave(group, batches, 1, "cpu", Progress("quiet"), "t", block=3, lead=1)
    warm = ["a", "b"]
    first = ["b"] * 4 + ["a"] * 4  # NOTE: the order rotates every turn
    last = ["a"] * 2 + ["b"] * 2
    assert events == warm + first + last
    assert {k: len(v) for k, v in samples.items()} == {"a": 4, "b": 4}
    events.clear()
    samples = run.interleave(group, batches[:3], 1, "cpu", Progress("quiet"), "t")
    assert events == ["a", "b", "b", "a", "a", "b"]
    assert {k: len(v) for k, v in samples.items()} == {"a": 2, "b": 2}


def test_missing_knobs_are_reported_not_measured() -> None:
    for ab in config.ABLATIONS:
        options, why = plait_options(ab)
        assert (options is None) == (why is not None)
        if why is not None:
            assert why.startswith("not available")


def test_percentiles() -> None:
    assert timing.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert timing.percentile([5.0], 95) == 5.0
    assert timing.summarize([0.001, 0.003])["p95_ms"] == pytest.approx(2.9)


@pytest.mark.parametrize("name", BENCH_MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_a_symbolic_programs_memory_plan_is_no_number_in_the_report() -> None:
    """A symbolic program's memory plan is sized per call ("per call"): the benchmark reports
    no number for it and computes no ratio from it (make bench crashed on the string)."""
    from benchmarks.bench.ablate import _ratio
    from benchmarks.bench.systems import _bytes_or_none

    assert _bytes_or_none("per call") is None and _bytes_or_none(True) is None
    assert _bytes_or_none(4096) == 4096
    assert _ratio("per call", 4096) is None and _ratio(4096, None) is None
    assert _ratio(8192, 4096) == 2.0

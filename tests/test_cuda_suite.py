"""The CUDA benchmark (benchmarks/cuda_suite.py), in what runs without a GPU: its command line,
its case table, the overhead case's model, the Triton kernel census, the report on a made-up
result, and the clear refusal (exit status 2) where there is no CUDA."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from benchmarks import cuda_suite as cs

ROOT = Path(__file__).resolve().parents[1]
TARGET_CASES = (
    "resnet50-fp32-b1",
    "resnet50-fp32-b64",
    "resnet50-bf16-b64",
    "vit_b_16-bf16-b32",
    "gpt2-6l-bf16",
    "overhead-10op",
)


def test_defaults_run_every_case_and_system() -> None:
    cfg = cs.parse_args([])
    assert cfg.cases == TARGET_CASES and cfg.systems == cs.SYSTEMS
    assert (cfg.quick, cfg.warm, cfg.rounds, cfg.budget_s, cfg.worker) == (
        False, True, None, None, None,
    )  # fmt: skip
    assert cfg.out == cs.OUT_DEFAULT and cfg.size == "full"


def test_selection_keeps_the_case_order_given_and_the_systems_order_known() -> None:
    cfg = cs.parse_args(
        ["--cases", "overhead-10op,resnet50-fp32-b1", "--systems", "plait,eager", "--quick",
         "--rounds", "7", "--out", "x", "--no-warm", "--budget-s", "60"]
    )  # fmt: skip
    assert cfg.cases == ("overhead-10op", "resnet50-fp32-b1")
    assert cfg.systems == ("eager", "plait")
    assert cfg.size == "quick" and not cfg.warm and cfg.budget_s == 60.0
    assert cfg.rounds_for(cs.case_named("overhead-10op")) == 7
    record = cfg.record()
    json.dumps(record)
    assert record["size"] == "quick" and record["warmup_calls"] >= 10


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--cases", "resnet51"], "overhead-10op"),  # NOTE: the known cases are named
        (["--systems", "plait"], "must include eager"),
        (["--systems", "eager,tvm"], "unknown systems"),
        (["--rounds", "0"], "--rounds"),
    ],
)
def test_usage_errors_exit_2_saying_what_is_wrong(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cs.parse_args(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_case_table_holds_the_target_cases() -> None:
    assert tuple(c.name for c in cs.CASES) == TARGET_CASES
    graphless = {c.name for c in cs.CASES if "plait-nograph" in c.systems(cs.SYSTEMS)}
    assert graphless == {"resnet50-fp32-b1", "overhead-10op"}
    dtypes = {c.name: c.dtype for c in cs.CASES}
    assert dtypes["resnet50-bf16-b64"] == dtypes["gpt2-6l-bf16"] == torch.bfloat16
    assert dtypes["resnet50-fp32-b64"] == torch.float32
    for c in cs.CASES:
        assert c.rounds >= 50 and c.quick_rounds >= 20
        assert cs.parse_args(["--quick"]).rounds_for(c) <= c.rounds
    with pytest.raises(ValueError, match="known"):
        cs.case_named("nope")


def test_overhead_case_is_ten_pointwise_ops_on_1024_floats() -> None:
    model, x = cs.build_pointwise("full", seed=0)
    assert x.shape == (1024,) and x.dtype == torch.float32
    y = model(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    graph = torch.fx.symbolic_trace(model).graph
    assert sum(n.op in ("call_function", "call_method") for n in graph.nodes) == 10
    assert torch.equal(x, cs.build_pointwise("full", seed=0)[1])  # NOTE: seeded


def test_gpt2_builder_gives_hidden_states_of_in_range_ids() -> None:
    pytest.importorskip("transformers")
    model, ids = cs.build_gpt2("tiny", seed=0)
    vocab = cs.GPT2_TINY["vocab_size"]
    assert ids.shape == cs.GPT2_IDS["tiny"] and ids.dtype == torch.int64
    assert int(ids.min()) >= 0 and int(ids.max()) < vocab
    config: Any = cast(Any, model).model.config
    assert config.use_cache is False and config._attn_implementation == "sdpa"
    with torch.no_grad():
        y = model(ids)
    assert isinstance(y, torch.Tensor) and y.shape == (*ids.shape, config.n_embd)
    assert cs.GPT2_IDS["full"] == (8, 512)


def test_to_device_keeps_integer_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "DEVICE", "cpu")
    model, x = cs.to_gpu(torch.nn.Linear(4, 2), torch.zeros(3, dtype=torch.int64), torch.bfloat16)
    assert x.dtype == torch.int64 and model.weight.dtype == torch.bfloat16
    _, f = cs.to_gpu(torch.nn.Linear(4, 2), torch.zeros(3), torch.bfloat16)
    assert f.dtype == torch.bfloat16


def test_kernel_census_counts_listener_compiles_and_new_cubins(tmp_path: Path) -> None:
    knobs = pytest.importorskip("triton").knobs
    triton_dir, plait_dir = tmp_path / "triton", tmp_path / "plait"
    (triton_dir / "old").mkdir(parents=True)
    (triton_dir / "old" / "k0.cubin").write_bytes(b"")
    before = knobs.compilation.listener
    with cs.KernelCensus([str(triton_dir), str(plait_dir)]) as census:
        listen = knobs.compilation.listener
        for hit in (False, False, True):
            listen(src=None, metadata={}, metadata_group={}, times=None, cache_hit=hit)
        for name in ("a", "b", "c"):
            (triton_dir / name).mkdir()
            (triton_dir / name / "k.cubin").write_bytes(b"")
        plait_dir.mkdir()
        (plait_dir / "k.cubin").write_bytes(b"")
    assert knobs.compilation.listener is before
    rec = census.record()
    assert rec["listener_compiled"] == 2 and rec["listener_cache_hits"] == 1
    assert rec["new_cubin_files"] == {str(triton_dir): 3, str(plait_dir): 1}
    assert rec["compiled"] == 3  # NOTE: the largest count, never a sum over directories
    assert len(rec["kernels"]) == 2  # NOTE: the compiled ones, named


def _system(ms: float | None, error: str | None = None, first: float = 1.0) -> dict[str, Any]:
    rec: dict[str, Any] = {"error": error, "warnings": [], "cold": {"first_call_s": first}}
    if ms is not None:
        rec["latency"] = {"p50_ms": ms, "p95_ms": ms * 1.1}
    return rec


def _fake_result() -> dict[str, Any]:
    ok_gate = {"ok": True, "worst_margin": 0.4, "errors": 0, "failures": []}
    bad_gate = {
        "ok": False, "worst_margin": 3.0, "errors": 1,
        "failures": [{"severity": "error", "check": "model", "where": "output[0]",
                      "case": "draw 1", "message": "error above budget"}],
    }  # fmt: skip
    cases: list[dict[str, Any]] = [
        {
            "name": "resnet50-fp32-b1", "status": "ran", "error": None,
            "systems": {"eager": _system(2.0), "inductor": _system(1.5, first=40.0),
                        "inductor-ro": _system(1.0, first=50.0), "plait": _system(0.8, first=10.0)},
            "plait": {
                "gate": ok_gate,
                "evidence": {"status": "whole", "counts": {"native": 60, "extern": 53,
                             "fallback": 0}, "kernels": 40, "cuda_graph": {"used": True},
                             "cache": "miss", "fallbacks": []},
                "warm": {"first_call_s": 0.9, "kernels": {"compiled": 0}},
            },
        },
        {
            "name": "gpt2-6l-bf16", "status": "ran", "error": None,
            "systems": {"eager": _system(5.0), "inductor-ro": _system(3.0),
                        "plait": _system(None, error="cold compile: RuntimeError: boom")},
            "plait": {"gate": bad_gate},
        },
        {"name": "vit_b_16-bf16-b32", "status": "skipped", "error": "time budget: 500 s > 480 s",
         "systems": {}, "plait": {}},
    ]  # fmt: skip
    for c in cases:
        for s in c["systems"].values():
            lat = s.get("latency")
            if lat:
                eager = c["systems"]["eager"]["latency"]["p50_ms"]
                ro = c["systems"]["inductor-ro"]["latency"]["p50_ms"]
                lat["speedup_vs_eager"] = eager / lat["p50_ms"]
                lat["speedup_vs_inductor_ro"] = ro / lat["p50_ms"]
    return {
        "config": cs.parse_args([]).record(),
        "environment": {"date": "2026-01-01", "gpu": "NVIDIA H200", "torch": "2.11",
                        "triton": "3.6.0", "plait": "0.1", "commit": "unknown"},
        "primer": {"plait": {"seconds": 1.0}, "inductor": {"seconds": 9.0}},
        "cases": cases,
        "verdict": cs.verdict(cases),
    }  # fmt: skip


def test_markdown_report_shows_numbers_failures_and_skips() -> None:
    result = _fake_result()
    text = cs.markdown(result)
    summary = next(line for line in text.splitlines() if line.startswith("| resnet50-fp32-b1 |"))
    cells = [c.strip() for c in summary.strip("|").split("|")]
    assert cells == ["resnet50-fp32-b1", "2.000", "1.500", "1.000", "0.800", "1.25x", "2.50x",
                     "10.0 / 50.0 (0.20)", "0 of 40 (0.9 s)", "pass (40%)", "yes"]  # fmt: skip
    gpt2 = next(line for line in text.splitlines() if line.startswith("| gpt2-6l-bf16 |"))
    assert "**error**" in gpt2 and "**FAILED**" in gpt2  # NOTE: a plait failure is never hidden
    assert "| vit_b_16-bf16-b32 | skipped: time budget" in text
    assert "gpt2-6l-bf16 / plait: cold compile: RuntimeError: boom" in text
    assert "**plait parity: FAILED**" in text
    assert result["verdict"]["exit_code"] == 1
    assert result["verdict"]["plait_errors"] == ["gpt2-6l-bf16 / plait"]


def test_outputs_are_strict_json_and_markdown(tmp_path: Path) -> None:
    result = _fake_result()
    result["cases"][0]["systems"]["plait"]["vs_eager"] = {"max_abs": math.nan}
    cs.write_outputs(result, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "cuda_suite.json").read_text())
    assert data["cases"][0]["systems"]["plait"]["vs_eager"]["max_abs"] is None
    assert (tmp_path / "out" / "cuda_suite.md").read_text().startswith("# plait on CUDA")


def test_main_without_cuda_exits_2_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cs.main(["--out", str(tmp_path)]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().err
    assert not (tmp_path / "cuda_suite.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_the_module_run_without_cuda_exits_nonzero(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cuda_suite", "--out", str(tmp_path), "--quick"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "cuda_suite: needs an NVIDIA GPU" in proc.stderr

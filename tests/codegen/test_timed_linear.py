"""A float32 linear of a constant weight without post-ops runs whichever of MKL's packed GEMM and
oneDNN's prepacked linear timed faster at compile time (``plait.codegen.timed_matmul``): the
manifest says which and why, a refusal keeps both times, a saved plan replays the choice without
timing anything (a chosen oneDNN weight loads from the entry's bytes), and either library answers
as eager within the contract's matmul budget on fresh inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.codegen import timed_choices, timed_matmul
from plait.codegen.onednn import LOADED
from plait.codegen.onednn_postops import mkl_linear_available
from tests.cache.helpers import status
from tests.util import contract_tol

pytestmark = pytest.mark.skipif(
    not mkl_linear_available() or not timed_matmul.strict_float32(),
    reason="needs MKL's packed linear and strict float32 oneDNN",
)
MKL, ONEDNN = "MKL packed linear", "oneDNN linear"


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16, bias=False)).eval()


def _inputs(seeds: range) -> list[torch.Tensor]:
    return [torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(s)) for s in seeds]


def _linears(compiled: Any) -> list[str]:
    """The details of the program's extern steps (the model's only externs are its linears),
    as the running program (not the manifest the entry saved) reports them."""
    tags = compiled.specializations[-1].compiled.program.evidence.nodes.values()
    return [t.detail for t in tags if t.executor == "extern"]


def _run(
    model: nn.Module, xs: list[torch.Tensor], cache: str | bool
) -> tuple[Any, list[torch.Tensor]]:
    compiled = plait.compile(model, options={"cache": cache})
    with torch.no_grad():
        outs = [compiled(x) for x in xs]
        for x, y in zip(xs, outs):
            torch.testing.assert_close(y, model(x), **contract_tol("matmul", torch.float32))
    return compiled, outs


@pytest.mark.parametrize("faster", ["oneDNN", "MKL"])
def test_the_faster_library_runs_and_a_warm_start_replays_it(
    faster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    times = (1e-6, 2e-6) if faster == "oneDNN" else (2e-6, 1e-6)
    monkeypatch.setattr(timed_matmul, "timings", lambda *a: times)
    cache = str(tmp_path / "cache")
    cold, _ = _run(_model(), _inputs(range(10, 12)), cache)
    assert status(cold.specializations[-1]) == "miss"
    details = _linears(cold)
    chosen = ONEDNN if faster == "oneDNN" else MKL
    assert len(details) == 2 and all(d.startswith(chosen) for d in details), details
    if faster == "oneDNN":
        assert all("timed faster than MKL's packed GEMM" in d for d in details), details
    refused = cold.specializations[-1].compiled.program.plan.refused
    timed = [r[timed_matmul.STAGE] for r in refused.values() if timed_matmul.STAGE in r]
    assert len(timed) == (2 if faster == "MKL" else 0), refused
    assert all("MKL's packed GEMM was faster" in r and "2 us" in r and "1 us" in r for r in timed)

    def untimed(*a: Any) -> Any:
        raise AssertionError("a saved plan timed a linear")

    monkeypatch.setattr(timed_matmul, "timings", untimed)
    warm, _ = _run(_model(), _inputs(range(20, 23)), cache)
    assert status(warm.specializations[-1]) == "hit"
    details = _linears(warm)
    assert len(details) == 2 and all(d.startswith(chosen) for d in details), details
    if faster == "oneDNN":  # NOTE: oneDNN's packs are portable: the entry carries them
        assert all(LOADED in d for d in details), details


def test_both_libraries_answer_alike_on_fresh_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same model compiled each way: both within the matmul budget of eager (checked in
    ``_run``) on draws that are not the capture's sample."""
    outs = {}
    for faster, times in (("oneDNN", (1e-6, 2e-6)), ("MKL", (2e-6, 1e-6))):
        monkeypatch.setattr(timed_matmul, "timings", lambda *a, t=times: t)
        timed_choices.store().forget()  # NOTE: the second compile times again
        compiled, outs[faster] = _run(_model(), _inputs(range(30, 33)), False)
        assert all(d.startswith(ONEDNN if faster == "oneDNN" else MKL) for d in _linears(compiled))
    for a, b in zip(outs["oneDNN"], outs["MKL"]):
        torch.testing.assert_close(a, b, **contract_tol("matmul", torch.float32))


def test_repeated_layers_are_timed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linears of one shape and layout share one measurement: a model's N layers pay for one
    (two here: the first layer reads the graph input, the rest buffers of another layout)."""
    timed: list[int] = []

    def counted(*a: Any) -> tuple[float, float]:
        timed.append(1)
        return (1e-6, 2e-6)

    monkeypatch.setattr(timed_matmul, "timings", counted)
    torch.manual_seed(0)
    layers = 5
    model = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(32, 32), nn.GELU())])
    # NOTE: 16 rows: more than plait's native kernel takes for a linear (MAX_LINEAR_ROWS)
    compiled, _ = _run(model.eval(), [torch.randn(16, 32) for _ in range(2)], False)
    assert len(_linears(compiled)) == layers and 1 <= len(timed) <= 2, timed

"""A oneDNN build that refuses the fused residual-add post-op (torch 2.11 on some hosts raises
``RuntimeError: could not create a memory``): the planner's compile-time dry run catches it and
runs the conv/linear unfused, the epilogue as a native kernel, with the reason on record."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
from benchmarks.models.resnet import resnet18
from plait.codegen import onednn

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-models")]


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.conv(x)) + x)
        z = y.mean((2, 3))
        return y, self.fc(z) + z


@pytest.fixture
def refuse_add(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def refuse(*args: Any) -> Any:
        calls.append("refused")
        raise RuntimeError("could not create a memory")

    monkeypatch.setattr(onednn, "conv_binary", refuse)
    monkeypatch.setattr(onednn, "linear_binary", refuse)
    return calls


def _factory(shape: tuple[int, ...]) -> Any:
    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

    return make


def _check(model: nn.Module, shape: tuple[int, ...]) -> list[dict[str, Any]]:
    model.eval()
    with torch.no_grad():
        # NOTE: no artifact cache: a saved plan replays the compile's oneDNN decisions (its key
        # pins the PyTorch build that made them), and these tests change oneDNN's answer by hand.
        # NOTE: linears through oneDNN (with MKL's packed GEMM a linear has no post-op to
        # refuse; plait's native kernel, which runs a linear of few rows, is off)
        options = {"cache": False, "stax": {"mkl_linear": False, "pointwise": False}}
        compiled = plait.compile(model, backend="stax", options=options)
        report = plait.conformance.check(
            model, lambda *xs: compiled(*xs), _factory(shape), candidate_module=model,
            op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    unfused: list[dict[str, Any]] = []
    for spec in compiled.specializations:
        evidence = spec.manifest.executor["evidence"]
        assert evidence["counts"]["fallback"] == 0, evidence["counts"]
        unfused += evidence["unfused"]
        details = {n["id"]: n["detail"] for n in evidence["nodes"]}
        for u in evidence["unfused"]:
            assert "could not create a memory" in details[u["id"]]
    return unfused


def test_refused_residual_add_runs_unfused(refuse_add: list[str]) -> None:
    torch.manual_seed(0)
    unfused = _check(Residual(), (2, 8, 6, 6))
    assert refuse_add, "the fused add was never tried"
    assert len(unfused) == 2, unfused
    assert all("add" in u["reason"] and "could not create a memory" in u["reason"] for u in unfused)


def test_refused_residual_add_resnet18(refuse_add: list[str]) -> None:
    torch.manual_seed(0)
    unfused = _check(resnet18(num_classes=10), (2, 3, 32, 32))
    assert len(unfused) == 8, unfused  # NOTE: one residual add per basic block.


def test_accepted_residual_add_stays_fused() -> None:
    torch.manual_seed(0)
    assert _check(Residual(), (2, 8, 6, 6)) == []

"""A Stax program rebuilt from a saved plan replays the compile's oneDNN decisions: no fused or
unfused oneDNN call is probed (the compile decided under the same key), a call refused at compile
time stays refused, and the records say where the decision came from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait.conformance
from plait.cache.compiled import load_compiled
from plait.codegen import onednn, timed_matmul
from plait.codegen.probing_oracle import ProbingOracle
from plait.codegen.replaying_oracle import SAVED
from plait.runtime import compile_graph
from tests.cache.helpers import call_program, convnet, run, sample, stax_entry


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + x)


def _factory(shape: tuple[int, ...]) -> Any:
    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)),)

    return make


def _rebuilt(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    store, key = stax_entry(cache)
    with monkeypatch.context() as m:

        def probe(self: Any, step: Any) -> None:
            raise AssertionError("a oneDNN call was probed while rebuilding from a saved plan")

        m.setattr(ProbingOracle, "_probe", probe)
        saved = load_compiled(store, key)
    assert saved is not None and saved.program is not None
    return saved.program


def test_rebuild_replays_accepted_calls_unprobed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    # NOTE: the conv runs oneDNN (not the native stem), so the plan has a call to replay
    expected, _ = run(convnet(), sample(), cache, options={"stax": {"stem": False}})
    program = _rebuilt(cache, monkeypatch)
    assert program.plan.from_saved_plan
    # NOTE: no oneDNN call refused; the head's library, timed at compile time, may be MKL's
    assert all(set(r) <= {timed_matmul.STAGE} for r in program.plan.refused.values())
    assert torch.equal(call_program(program, sample()), expected)
    details = [t.detail for t in program.evidence.nodes.values() if t.detail.startswith("oneDNN")]
    assert details and all(SAVED in d for d in details), details


def _refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise RuntimeError("could not create a memory")

    monkeypatch.setattr(onednn, "conv_binary", refuse)


def test_rebuild_replays_a_refusal_without_trying_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = Residual().eval()
    x = torch.randn(2, 8, 6, 6)
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:
        _refuse(m)
        out, spec = run(model, x, cache)
    (cold,) = spec.manifest.executor["evidence"]["unfused"]
    assert "could not create a memory" in cold["reason"]

    calls: list[str] = []
    monkeypatch.setattr(onednn, "conv_binary", lambda *a: calls.append("tried") or 1 / 0)
    program = _rebuilt(cache, monkeypatch)
    assert calls == [], "the refused fused call was tried again"
    (position,) = program.plan.refused
    assert "could not create a memory" in program.plan.refused[position]["fused"]
    (reason,) = program.evidence.unfused.values()
    assert "could not create a memory" in reason and SAVED in reason
    assert torch.equal(call_program(program, x), out)
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda x: call_program(program, x), _factory((2, 8, 6, 6)),
            candidate_module=model, op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)


def test_bare_layouts_still_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Layouts without the compile's decisions (a caller's own): each oneDNN call is probed
    once, as before."""
    cache = tmp_path / "cache"
    run(convnet(), sample(), cache)
    store, key = stax_entry(cache)
    saved = load_compiled(store, key)
    assert saved is not None and saved.program is not None
    probed: list[int] = []
    real = ProbingOracle._probe

    def probe(self: Any, step: Any) -> None:
        probed.append(step.node.id)
        real(self, step)

    monkeypatch.setattr(ProbingOracle, "_probe", probe)
    bare = dict(saved.program.layouts())
    program = compile_graph(saved.graph, options=saved.program.options, layouts=bare)
    assert probed and not program.plan.from_saved_plan
    assert [s.get("name") or s.get("op") for s in program.schedule()] == [
        s.get("name") or s.get("op") for s in saved.program.schedule()
    ]

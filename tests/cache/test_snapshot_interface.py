"""A warm start that hits the artifact cache reads only the interface of the snapshot's graph
(its inputs and the names it returns): the nodes are parsed when something asks for the graph.
``plait.ir.parser.graph_interface`` must say what ``from_text`` says of those parts, on any
graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import plait
from plait.ir import GraphBuilder, TensorType, from_text, to_text
from plait.ir.parser import graph_interface
from plait.snapshots import snapshot as snapshot_mod
from plait.snapshots.snapshot import SnapshotProgram
from tests.cache.helpers import convnet, run, sample, status


def _spy_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = snapshot_mod.from_text

    def spy(text: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(snapshot_mod, "from_text", spy)
    return parsed


def test_a_warm_hit_never_parses_the_snapshot_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cold = run(convnet(), sample(), tmp_path)
    assert status(cold) == "miss" and cold.graph is not None
    parsed = _spy_parses(monkeypatch)
    model, x = convnet(), sample(seed=5)  # NOTE: a fresh input, not the captured one
    got, warm = run(model, x, tmp_path)
    assert status(warm) == "hit" and str(warm.manifest.cache["capture"]).startswith("snapshot")
    assert isinstance(warm.program, SnapshotProgram) and parsed == []
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
    # NOTE: asked for, the graph is parsed once, and is the captured one
    assert to_text(warm.graph) == to_text(cold.graph) and len(parsed) == 1
    assert warm.graph is warm.graph and len(parsed) == 1
    inputs, _ = warm.program.interface()
    assert [v.name for v in inputs] == [v.name for v in cold.graph.inputs]


class _Accumulate(nn.Module):
    """A buffer written in place (a mutation copied back after each call)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.total.add_(y.sum(0))
        return y


def _xs(n: int, *shape: int) -> list[torch.Tensor]:
    return [torch.randn(*shape, generator=torch.Generator().manual_seed(40 + s)) for s in range(n)]


def _run_beside(model: _Accumulate, ref: _Accumulate, cache: Path, calls: int) -> Any:
    """``model`` compiled (on ``cache``) and called ``calls`` times beside eager ``ref``: the
    outputs and the written buffer agree after every call."""
    compiled = plait.compile(model, options={"warm_start": "fingerprint", "cache": str(cache)})
    with torch.no_grad():
        for x in _xs(calls, 2, 4):
            torch.testing.assert_close(compiled(x), ref(x))
            torch.testing.assert_close(model.total, ref.total)
    return compiled


def test_a_buffer_the_program_writes_is_never_frozen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: frozen, its version guard failed on every next call: one recompile per call
    torch.manual_seed(3)
    model, ref = _Accumulate(), _Accumulate()
    ref.load_state_dict(model.state_dict())
    compiled = _run_beside(model, ref, tmp_path, 4)
    (spec,) = compiled.specializations
    assert compiled.recompile_reasons == [] and "total" not in spec.manifest.graph["frozen"]
    assert "lin.weight" in spec.manifest.graph["frozen"]
    # NOTE: a new process's warm start: the same, without the snapshot's nodes parsed
    parsed = _spy_parses(monkeypatch)
    warm = _run_beside(model, ref, tmp_path, 3)
    (spec,) = warm.specializations
    assert status(spec) == "hit" and parsed == [] and "total" in spec.program.written_inputs()


def test_batch_norm_in_train_mode_under_no_grad_compiles_once() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    ref.load_state_dict(model.state_dict())
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        for x in _xs(4, 2, 3, 6, 6):
            torch.testing.assert_close(compiled(x), ref(x))
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
    torch.testing.assert_close(model[1].running_var, ref[1].running_var)
    assert len(compiled.specializations) == 1 and compiled.recompile_reasons == []


_OPS = ["relu", "neg", "exp", "tanh"]


@settings(max_examples=40, deadline=None)
@given(
    n_inputs=st.integers(1, 4),
    ops=st.lists(st.tuples(st.sampled_from(_OPS), st.integers(0, 10)), min_size=0, max_size=6),
    returns=st.lists(st.integers(0, 20), min_size=1, max_size=4),
    kinds=st.lists(st.sampled_from(["user", "param", "buffer"]), min_size=4, max_size=4),
)
def test_the_interface_is_what_the_full_parse_says(
    n_inputs: int, ops: list[tuple[str, int]], returns: list[int], kinds: list[str]
) -> None:
    gb = GraphBuilder()
    values = [
        gb.input(f"in{i}.w", TensorType((2, i + 1), torch.float32), kind=kinds[i])
        for i in range(n_inputs)
    ]
    for op, k in ops:
        values.append(gb.call(op, values[k % len(values)]))
    gb.output(*[values[r % len(values)] for r in returns])
    text = to_text(gb.build())
    full = from_text(text, verify=False)
    inputs, returned = graph_interface(text)
    assert [(v.name, v.kind, v.type) for v in inputs] == [
        (v.name, v.kind, v.type) for v in full.inputs
    ]
    assert returned == [o.name for o in full.outputs]


def test_an_unreadable_return_line_falls_back_to_the_full_parse() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3,), torch.float32))
    gb.output(gb.call("relu", x), x)
    text = to_text(gb.build())
    odd = text.replace("  return ", "  return   ", 1)  # NOTE: not the form to_text writes
    inputs, returned = graph_interface(odd)
    assert [v.name for v in inputs] == ["x"]
    assert returned == [o.name for o in from_text(odd).outputs] == graph_interface(text)[1]
    with pytest.raises(ValueError):
        graph_interface(text.replace("f32[3]", "f32[3", 1))

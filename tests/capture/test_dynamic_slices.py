"""With ``dynamic=True``, slices whose bounds are symbolic sizes keep the sizes symbolic: one
specialization serves every size its guards admit, bitwise equal to eager on fresh inputs; a
bound the IR cannot express (one the capture sample clamps) still specializes, with a reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from benchmarks.models.gpt2 import GPT2, Block, CausalSelfAttention, GPT2Config
from plait.frontend import capture_program
from tests.capture.helpers import assert_same


def _serves(fn: Any, make: Callable[[int], tuple], sizes: tuple[int, ...]) -> Any:
    """Compile with ``dynamic=True``, check each size bitwise; returns the compiled callable."""
    compiled = plait.compile(fn, backend="eager", dynamic=True, fullgraph=True)
    for i, n in enumerate(sizes):
        torch.manual_seed(i)
        args = make(n)
        assert_same(compiled(*[a.clone() for a in args]), fn(*args), f"size {n}")
    return compiled


def _one_graph(compiled: Any) -> Any:
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    return compiled.specializations[0]


def _reads(x: torch.Tensor, table: torch.Tensor) -> Any:
    n = x.shape[1]
    # NOTE: cloned: an output that is a view of an input is made again from it on each call,
    # which specializes its sizes (docs/capture.md); the slices stay symbolic here
    views = (
        x[:, : n - 1],
        x[:, n // 2 :],
        x[:, 1:-1],
        x[:, -2:],
        x[..., 1 : n - 1 : 2],
        x.narrow(1, 1, n - 2),
        x.narrow(1, -2, 2),
    )
    return (
        *(v.clone() for v in views),
        table[:n, :n] * x[0],  # NOTE: static dim 8, symbolic bound: exact length under a guard
        table[:, :n].sum(0),
    )


def test_symbolic_slice_bounds_stay_symbolic() -> None:
    table = torch.randn(8, 8)
    compiled = _serves(lambda x: _reads(x, table), lambda n: (torch.randn(3, n),), (5, 7, 3, 8))
    spec = _one_graph(compiled)
    assert str(spec.graph.inputs[0].type) == "f32[s0, s1]"
    text = str(spec.guards)
    assert "x.shape[1] <= 8" in text, text


def test_a_bound_past_the_guarded_range_recompiles_once() -> None:
    table = torch.randn(8, 3)

    def f(x: torch.Tensor) -> torch.Tensor:
        return table[: x.shape[0]] + 1

    compiled = _serves(f, lambda n: (torch.randn(n, 3),), (4, 6, 10, 12, 5))
    assert len(compiled.specializations) == 2
    assert compiled.recompile_reasons[0].startswith("x.shape[0] <= 8: expected True, got False")


def test_writes_through_symbolic_slices() -> None:
    def f(x: torch.Tensor) -> Any:
        t = x.shape[0]
        buf = torch.zeros(16, x.shape[1])
        buf[:t] = x
        buf[t : t + 1] = 1.0
        y = x.clone()
        y[1:] = 0.5
        y[-1] = 2.0
        y[:, : x.shape[1] - 1].mul_(3)
        return buf, y

    _one_graph(_serves(f, lambda n: (torch.randn(n, 6),), (4, 9, 3)))


def test_a_clamped_negative_bound_specializes_with_a_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x[:, -5:] * 2

    prog = capture_program(f, (torch.randn(2, 3),), dynamic=True)
    assert prog.graph is not None
    assert prog.specialized == ["x.shape[1]: a negative slice bound that the capture sample clamps"]
    assert str(prog.graph.inputs[0].type) == "f32[s0, 3]"
    compiled = _serves(f, lambda n: (torch.randn(4, n),), (3, 3, 7, 9))
    assert len(compiled.specializations) == 2


def test_seed_example_still_dynamic() -> None:
    def seed(x: torch.Tensor) -> torch.Tensor:
        return x.relu() if x.shape[0] > 2 else x.sigmoid()

    spec = _one_graph(_serves(seed, lambda n: (torch.randn(n, 5),), (4, 3, 7)))
    assert str(spec.graph.inputs[0].type) == "f32[s0, s1]"


CFG = {"vocab_size": 64, "block_size": 16, "n_layer": 2, "n_head": 2, "d_model": 16}


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
def test_gpt2_attention_and_blocks_serve_every_sequence_length(attention: str) -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(**CFG, attention=attention)  # type: ignore[arg-type]
    for module in (CausalSelfAttention(cfg).eval(), Block(cfg).eval()):
        compiled = _serves(module, lambda t: (torch.randn(3, t, 16),), (10, 12, 16, 2))
        spec = _one_graph(compiled)
        assert str(spec.graph.inputs[0].type) == "f32[s0, s1, 16]"
        assert spec.opaque_counts == {}


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
def test_gpt2_dynamic_sequence_length(attention: str) -> None:
    """The whole model: bitwise at several lengths, one graph (``torch.arange(0, t)`` keeps the
    sequence length symbolic: the IR's ``arange`` takes a size expression), under the model's
    own range check as a guard; and with the positions given as an input."""
    torch.manual_seed(0)
    model = GPT2(GPT2Config(**CFG, attention=attention)).eval()  # type: ignore[arg-type]
    prog = capture_program(model, (torch.randint(0, 64, (3, 10)),), dynamic=True)
    assert prog.specialized == []
    compiled = _serves(model, lambda t: (torch.randint(0, 64, (2, t)),), (10, 12, 10))
    spec = _one_graph(compiled)
    assert str(spec.graph.inputs[0].type) == "i64[s0, s1]"
    assert f"idx.shape[1] <= {CFG['block_size']}" in spec.guards.texts()

    def body(idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = model.drop(model.wte(idx) + model.wpe(pos))
        for block in model.h:
            x = block(x)
        return model.lm_head(model.ln_f(x))

    compiled = _serves(
        body, lambda t: (torch.randint(0, 64, (2, t)), torch.arange(t)), (10, 12, 16, 3)
    )
    spec = _one_graph(compiled)
    assert str(spec.graph.inputs[0].type) == "i64[s0, s1]"

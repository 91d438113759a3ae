"""Training under ``torch.autocast(bfloat16)``: capture writes autocast's casts into the graph,
the compiled program runs with autocast off, and the gate judges outputs and gradients."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
from tests.autograd.test_training_models import MODELS
from tests.conformance.models import MLP, randn, seeded


def _bf16(fn: Callable[..., Any], device: str = "cpu") -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        with torch.autocast(device, dtype=torch.bfloat16):
            return fn(*args)

    return call


def gate_bf16_training(
    model: nn.Module, compiled: Any, draw: Callable[[int], Any], device: str = "cpu"
) -> None:
    """The gate on outputs and gradients under bfloat16 autocast on ``device``, anchored on a
    float64 copy of ``model`` without autocast's casts (the exact computation)."""
    report = plait.conformance.check(
        _bf16(model, device),
        _bf16(compiled, device),
        draw,
        grads=True,
        draws=2,
        reference_module=model,
        candidate_module=compiled,
        reference64=copy.deepcopy(model).double(),
        precision=torch.bfloat16,
    )
    report.raise_if_failed()


CASES = {
    "mlp": (lambda: seeded(1, MLP), lambda s: randn(8, 16, seed=s)),
    "convbn": MODELS["convbn"],
    "hf-gpt2": MODELS["hf-gpt2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_autocast_training_passes_the_gate(name: str) -> None:
    make, draw = CASES[name]
    model = seeded(0, make).train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: no fallback: capture takes autocast
        compiled = plait.compile(copy.deepcopy(model), backend="stax")
    gate_bf16_training(model, compiled, draw)
    (spec,) = compiled.specializations
    m = spec.compiled.manifest
    assert m.autograd["wrt"]
    # NOTE: a training batch norm of a 16-bit input and float32 statistics (autocast's) is
    # ATen's functional kernel, forward and backward, an extern call: no fallback
    assert not m.fallbacks, m.fallbacks
    assert any(n.op == "to_dtype" for n in spec.graph.nodes)  # NOTE: autocast's casts
    assert any("cpu:bfloat16" in g for g in m.guards)


def test_autocast_dtype_is_guarded() -> None:
    model = seeded(1, MLP)
    compiled = plait.compile(model, backend="stax")
    x = randn(8, 16, seed=3)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            got, want = compiled(x), model(x)
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want)
    with torch.no_grad():
        assert compiled(x).dtype == torch.float32
    assert len(compiled.specializations) == 3
    assert any("autocast" in r for r in compiled.recompile_reasons)


def test_a_compiled_program_never_casts_again_under_autocast() -> None:
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # NOTE: a float32 softmax over bfloat16 logits (autocast's linear)
            return torch.softmax(self.fc(x).float(), -1)

    model = seeded(2, Head)
    compiled = plait.compile(model, backend="stax")
    x = randn(4, 16, seed=4)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = compiled(x), model(x)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_autocast_capture_keeps_the_random_stream() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # NOTE: autocast's linear (bfloat16), then a dropout that draws
        h = torch.nn.functional.linear(x, w)
        return torch.nn.functional.dropout(h, 0.5, training=True) + torch.rand_like(h)

    compiled = plait.compile(fn, backend="stax")
    x, w = randn(4, 16, seed=7), randn(8, 16, seed=8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(x, w)  # NOTE: captured here, the generator not freshly seeded
    for seed in (1, 2):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            torch.manual_seed(seed)
            got = compiled(x, w)
            torch.manual_seed(seed)
            want = fn(x, w)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].fallback_reason is None


@pytest.mark.parametrize("train", [True, False])
def test_the_compile_inside_autocast_runs_with_autocast_off(
    train: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: what a compile runs (dry runs, a CUDA graph's capture) must not be cast again by
    # the user's autocast: on CUDA, autocast's float32 `sum` once made a bfloat16 program read
    # a float32 buffer at the compile's CUDA graph capture
    import plait.runtime.program as program

    seen: list[bool] = []
    original = program.compile_graphs

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.is_autocast_enabled("cpu"))
        return original(*args, **kwargs)

    monkeypatch.setattr(program, "compile_graphs", recording)
    monkeypatch.setattr("plait.runtime.training.compile_graphs", recording)
    model = seeded(0, MLP).train(train)
    compiled = plait.compile(model, options={"cache": False})
    x = randn(8, 16, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.set_grad_enabled(train):
        got = compiled(x)
        assert torch.is_autocast_enabled("cpu")  # NOTE: the user's autocast is back after it
        want = model(x)
    assert seen == [False]
    assert got.dtype == want.dtype


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_training_batch_norm_nodes_have_the_kernels_result_types(half: torch.dtype) -> None:
    # NOTE: the IR types an aten node from the fake-tensor meta kernel; for a 16-bit input with
    # float32 statistics (autocast's) ATen's kernels keep the batch statistics in float32
    import json

    from plait.ir import GraphBuilder, TensorType

    x = randn(4, 3, 5, 5, seed=1).to(half)
    stats = [randn(3, seed=s) for s in (2, 3, 4)] + [randn(3, seed=5).abs()]
    gb = GraphBuilder()
    operands = [gb.input(f"t{i}", TensorType.of(t)) for i, t in enumerate([x, *stats])]
    literals = json.dumps([{"t": i} for i in range(5)] + [True, 0.1, 1e-5])
    node = gb.call(
        "aten",
        operands,
        name="_native_batch_norm_legit_functional",
        overload="default",
        literals=literals,
    )
    ran = torch.ops.aten._native_batch_norm_legit_functional.default(x, *stats, True, 0.1, 1e-5)
    assert [v.type.dtype for v in node] == [r.dtype for r in ran]
    assert [v.type.shape for v in node] == [tuple(r.shape) for r in ran]

"""The Stax Triton target end to end on CPU tensors, through Triton's interpreter: the same plan,
memory plan and runner as on CUDA (kernels launched with tensors, externs through PyTorch), judged
by the conformance gate against eager on fresh inputs. CUDA graphs are covered in tests/gpu."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import copy
from typing import Any

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)
from torch import nn

import plait
import plait.conformance
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.resnet import resnet18
from plait.codegen.errors import CodegenError
from plait.ir import GraphBuilder, TensorType
from plait.runtime import StaxOptions, compile_graph
from tests.codegen.test_clamp_bound_underflow import CASES as CLAMPS
from tests.codegen.test_clamp_bound_underflow import check_clamp
from tests.codegen.test_scaled_add_fma import OPS as SCALED_ADDS
from tests.codegen.test_scaled_add_fma import check_scaled_add

TRITON = {"stax": {"target": "triton"}}


def _judged(model: nn.Module, example: tuple[Any, ...]) -> Any:
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, backend="stax", options=TRITON)
    with torch.no_grad():
        report = plait.conformance.check(
            reference, compiled, example, draws=2, candidate_module=model, seed=0, stress=None
        )
    assert report.ok, str(report)
    (spec,) = compiled.specializations
    ex = spec.manifest.executor
    assert ex["target"] == "triton" and ex["evidence"]["counts"]["fallback"] == 0
    kernels = spec.manifest.kernels["kernels"]
    assert kernels and all(k["symbol"].startswith("triton_") for k in kernels)
    return spec


@pytest.mark.slow
def test_convnet_with_residuals_pools_and_linear_head() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    spec = _judged(model, (x,))
    assert spec.manifest.executor["cuda_graph"]["used"] is False  # NOTE: CPU tensors


@pytest.mark.slow
def test_transformer_with_layer_norm_softmax_and_gelu() -> None:
    cfg = GPT2Config(vocab_size=50, block_size=16, n_layer=1, n_head=2, d_model=16, dropout=0.0)
    for attention in ("sdpa", "explicit"):
        cfg.attention = attention
        torch.manual_seed(0)
        model = GPT2(cfg).eval()
        ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
        _judged(model, (ids,))


def test_program_outputs_are_fresh_and_inputs_checked() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 5), torch.float32))
    y = gb.call("relu", gb.call("mul", x, 3.0))
    gb.output(y, gb.call("sum", y, dims=[1]))
    program = compile_graph(gb.build(), options=StaxOptions(target="triton"))
    a = torch.randn(4, 5)
    first = program(a)
    second = program(torch.randn(4, 5))
    assert torch.equal(first[0], (a * 3).relu())
    tol = plait.contract.load().tolerance("reduction", torch.float32)
    assert torch.allclose(first[1], (a * 3).relu().sum(1), rtol=tol.rtol, atol=tol.atol)
    assert first[0].data_ptr() != second[0].data_ptr()
    with pytest.raises(TypeError, match="expected"):
        program(torch.randn(4, 6))
    assert program.records()["target"] == "triton"


def test_triton_on_cpu_tensors_needs_the_interpreter_and_targets_are_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3,), torch.float32))
    gb.output(gb.call("exp", x))
    graph = gb.build()
    with pytest.raises(CodegenError, match="unknown Stax target 'tvm'"):
        compile_graph(graph, options=StaxOptions(target="tvm"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(CodegenError, match="TRITON_INTERPRET=1"):
        compile_graph(graph, options=StaxOptions(target="triton"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(SCALED_ADDS))
def test_scaled_add_keeps_eagers_infinities(name: str, dtype: torch.dtype) -> None:
    """add/sub with alpha as eager's fused multiply-add: an infinite x beside a y whose scaled
    value overflows is x, not inf - inf (tests/codegen/test_scaled_add_fma.py)."""
    check_scaled_add(name, dtype, TRITON)


@pytest.mark.parametrize("name", sorted(CLAMPS))
def test_clamp_bound_converted_to_float16(name: str) -> None:
    """A clamp bound below float16's least subnormal is a zero there, as ATen converts it
    (tests/codegen/test_clamp_bound_underflow.py)."""
    check_clamp(name, torch.float16, TRITON)

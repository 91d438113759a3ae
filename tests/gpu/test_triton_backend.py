"""The Stax backend on CUDA: Triton kernels, PyTorch's CUDA externs and one whole-program CUDA
graph, judged by the conformance gate against eager on fresh inputs. Skipped without CUDA."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
import plait.contract
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.resnet import resnet18

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
pytest.importorskip("triton")


def _compiled_and_judged(
    model: nn.Module, example: tuple[Any, ...], **options: Any
) -> plait.api.CompiledModule:
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, **options)
    with torch.no_grad():
        compiled(*example)  # NOTE: the gate judges the specialization the calls ran
        report = plait.conformance.check(
            reference, compiled, example, draws=3, candidate_module=model, seed=0
        )
    assert report.ok, str(report)
    return compiled


def _executor(compiled: Any) -> dict[str, Any]:
    (spec,) = compiled.specializations
    return spec.manifest.executor


def _image(batch: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch)
    return torch.randn(batch, 3, 32, 32, generator=g).to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_resnet_runs_triton_kernels_and_cuda_externs_in_one_graph(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).cuda().eval().to(dtype)
    compiled = _compiled_and_judged(model, (_image(4, dtype),))
    ex = _executor(compiled)
    assert ex["target"] == "triton" and ex["device"] == "cuda:0"
    assert ex["cuda_graph"]["used"] is True, ex["cuda_graph"]
    counts = ex["evidence"]["counts"]
    assert counts["fallback"] == 0 and counts["native"] > 0 and counts["extern"] > 0
    kernels = compiled.specializations[0].manifest.kernels["kernels"]
    assert kernels and all(k["symbol"].startswith("triton_") for k in kernels)


def test_gpt2_bf16_with_sdpa_and_explicit_attention() -> None:
    cfg = GPT2Config(vocab_size=96, block_size=64, n_layer=2, n_head=4, d_model=64, dropout=0.0)
    for attention in ("sdpa", "explicit"):
        cfg.attention = attention
        torch.manual_seed(0)
        model = GPT2(cfg).cuda().eval().to(torch.bfloat16)
        ids = torch.randint(0, 96, (2, 48), generator=torch.Generator().manual_seed(1)).cuda()
        compiled = _compiled_and_judged(model, (ids,))
        assert _executor(compiled)["cuda_graph"]["used"] is True


def test_cuda_graph_outputs_survive_the_next_call_and_inputs_are_checked() -> None:
    f = plait.compile(lambda x: (x * 2).relu() + 1)
    a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
    ya = f(a)
    yb = f(b)
    assert torch.equal(ya, (a * 2).relu() + 1) and torch.equal(yb, (b * 2).relu() + 1)
    assert _executor(f)["cuda_graph"]["used"] is True
    # a non-contiguous input is copied into the graph's static buffer
    c = torch.randn(2000, device="cuda")[::2]
    assert torch.equal(f(c), (c * 2).relu() + 1)


def test_cuda_graphs_off_runs_kernel_by_kernel() -> None:
    x = torch.randn(64, 64, device="cuda")
    f = plait.compile(lambda x: torch.softmax(x, -1) * x.sum(0), options={"cuda_graphs": False})
    tol = plait.contract.load().tolerance("normalization", x.dtype)
    want = torch.softmax(x, -1) * x.sum(0)
    assert torch.allclose(f(x), want, rtol=tol.rtol, atol=tol.atol)
    graph = _executor(f)["cuda_graph"]
    assert graph["used"] is False and "cuda_graphs=False" in graph["reason"]


def test_a_fallback_node_keeps_the_program_out_of_a_cuda_graph() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).cuda().train()
    x = torch.randn(8, 16, device="cuda")
    with torch.no_grad():
        f = plait.compile(model)
        f(x)  # NOTE: compiled first: capture draws samples of its own
        torch.manual_seed(3)
        got = f(x)
        torch.manual_seed(3)
        want = model(x)
    tol = plait.contract.load().tolerance("matmul", x.dtype)
    assert torch.allclose(got, want, rtol=tol.rtol, atol=tol.atol)
    graph = _executor(f)["cuda_graph"]
    assert graph["used"] is False and "falls back" in graph["reason"]


def test_cpu_and_cuda_agree_within_the_contract() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref64 = copy.deepcopy(model).double()(x.double())
        eager_err = (model(x).double() - ref64).abs().max()
        cpu = plait.compile(copy.deepcopy(model))(x)
        cuda = plait.compile(copy.deepcopy(model).cuda())(x.cuda()).cpu()
    factor = plait.contract.load().model_tail_factor("float32")
    for got in (cpu, cuda):
        # NOTE: the contract's model-level rule for the worst error: within its tail factor of
        # eager's own worst error against float64
        assert (got.double() - ref64).abs().max() <= factor * eager_err


Check = Callable[[torch.Tensor], torch.Tensor]
TEMPLATES: list[tuple[str, str, Check]] = [
    ("gelu-tanh", "pointwise", lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    ("silu-mul", "pointwise", lambda x: torch.nn.functional.silu(x) * x),
    ("layer_norm", "normalization", lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:])),
    ("log_softmax", "normalization", lambda x: torch.log_softmax(x, -1)),
    ("amax-nan", "reduction", lambda x: torch.where(x > 2, float("nan"), x).amax(-1)),
    ("var", "reduction", lambda x: x.var(0)),
]


@pytest.mark.parametrize("name,op_class,fn", TEMPLATES, ids=[n for n, _, _ in TEMPLATES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_templates_on_cuda(name: str, op_class: str, fn: Check, dtype: torch.dtype) -> None:
    f = plait.compile(fn)
    x = torch.randn(37, 3000, generator=torch.Generator().manual_seed(0)).to("cuda", dtype)
    f(x)
    report = plait.conformance.check(fn, f, (x,), draws=3, op_class=op_class, seed=1)
    assert report.ok, str(report)
    assert _executor(f)["target"] == "triton"


WARM_CHILD = """
import copy, json, torch, plait, plait.conformance
from triton import knobs
from benchmarks.models.resnet import resnet18
torch.backends.cuda.matmul.allow_tf32 = False  # NOTE: the contract judges IEEE float32
torch.backends.cudnn.allow_tf32 = False
compiled_now = []
knobs.compilation.listener = lambda **e: compiled_now.append(bool(e.get("cache_hit")))
torch.manual_seed(0)
model = resnet18(num_classes=10).cuda().eval()
reference = copy.deepcopy(model)
x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)).cuda()
compiled = plait.compile(model)
with torch.no_grad():
    compiled(x)
    report = plait.conformance.check(
        reference, compiled, (x,), draws=2, candidate_module=model, seed=0
    )
(spec,) = compiled.specializations
t = spec.manifest.timings
print(json.dumps({
    "compiled": compiled_now.count(False), "loaded": compiled_now.count(True),
    "precompiled": t.get("stax.triton_precompile.kernels"),
    "jobs": t.get("stax.triton_precompile.jobs"),
    "pooled": t.get("stax.triton_precompile.pooled"),
    "workers": t.get("stax.triton_precompile.workers"),
    "kernels": len(spec.manifest.kernels["kernels"]),
    "fallbacks": spec.manifest.fallbacks, "gate": report.ok, "report": str(report)[:2000],
}))
"""


def _warm_child(tmp: Any) -> dict[str, Any]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(tmp / "plait"),
        "TRITON_CACHE_DIR": str(tmp / "triton"),
        "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", WARM_CHILD], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_kernels_compile_in_worker_processes_and_a_warm_start_compiles_none(tmp_path: Any) -> None:
    cold = _warm_child(tmp_path)
    assert cold["fallbacks"] == [], cold["fallbacks"]
    # NOTE: every kernel compiled before the first launch, by the compile workers
    # (plait.codegen.triton_pool): this process loaded each under its own key, compiling none
    assert cold["precompiled"] and cold["jobs"] > 1, cold
    assert cold["pooled"] >= 2 and cold["workers"] >= 2, cold
    assert cold["compiled"] == 0 and cold["loaded"] >= cold["pooled"], cold
    assert cold["gate"], cold["report"]
    warm = _warm_child(tmp_path)
    assert warm["compiled"] == 0 and warm["loaded"] >= 1, warm
    assert warm["gate"], warm["report"]

"""Symbolic sizes on CUDA: one compile with ``dynamic=True`` serves every size by compiled Triton
kernels that take the sizes as arguments (their binaries do not specialize on them), each call
judged by the conformance gate against eager; CUDA graphs are refused with the reason in the
manifest (a captured graph replays one size). Skipped without CUDA."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)

import plait
import plait.conformance
from benchmarks.models.gpt2 import Block, GPT2Config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
OPTIONS = {"cache": False}  # NOTE: CUDA tensors: the Triton target by default


def _programs() -> dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[Any, ...]]]]:
    def cuda(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda")

    return {
        "pointwise_chain": (
            lambda x: ((x * 1.5 - 0.25).relu().sigmoid() * x).tanh().exp(),
            lambda a, b: (cuda(a, b),),
        ),
        "broadcast": (
            lambda x, y, z: (x + y) * z - y.exp(),
            lambda a, b: (cuda(a, b), cuda(1, b), cuda(a, 1)),
        ),
        "row_reductions": (
            lambda x: (x.sum(-1), x.amax(-1), x.softmax(-1), F.layer_norm(x, (x.shape[-1],))),
            lambda a, b: (cuda(a, b),),
        ),
    }


def _one_triton_specialization(compiled: Any) -> None:
    report = plait.explain(compiled)
    assert len(report.specializations) == 1, compiled.recompile_reasons
    manifest = report.specializations[0].manifest
    ex = manifest.executor
    assert ex["backend"] == "stax" and ex["target"] == "triton", ex
    assert manifest.fallbacks == [] and ex["evidence"]["counts"]["fallback"] == 0
    assert ex["cuda_graph"]["used"] is False
    assert "symbolic sizes" in ex["cuda_graph"]["reason"]
    kernels = manifest.kernels["kernels"]
    assert kernels and all(k["symbol"].startswith("triton_") for k in kernels)


@pytest.mark.parametrize("name", ["pointwise_chain", "broadcast", "row_reductions"])
def test_one_compile_serves_random_sizes_on_cuda(name: str) -> None:
    fn, make = _programs()[name]
    compiled = plait.compile(fn, backend="stax", dynamic=True, fullgraph=True, options=OPTIONS)
    with torch.no_grad():
        compiled(*make(5, 7))
    rng = random.Random(name)
    # NOTE: multiples of 16 and not (Triton would specialize those if it were let)
    sizes = [(rng.randint(2, 300), rng.randint(2, 5000)) for _ in range(4)] + [(32, 4096)]
    for a, b in sizes:
        with torch.no_grad():
            report = plait.conformance.check(fn, compiled, make(a, b), draws=1)
        assert report.ok, f"{a}x{b}: {report}"
    _one_triton_specialization(compiled)


def test_transformer_block_serves_batch_sizes_and_sequence_lengths_on_cuda() -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(block_size=256, n_head=4, d_model=64, attention="explicit")
    model = Block(cfg).eval().cuda()
    compiled = plait.compile(model, backend="stax", dynamic=True, fullgraph=True, options=OPTIONS)
    with torch.no_grad():
        compiled(torch.randn(2, 9, 64, device="cuda"))
    for batch, seq in ((3, 5), (2, 100), (16, 256), (64, 3)):
        x = torch.randn(batch, seq, 64, device="cuda")
        with torch.no_grad():
            report = plait.conformance.check(model, compiled, (x,), draws=1, candidate_module=model)
        assert report.ok, f"{batch}x{seq}: {report}"
    _one_triton_specialization(compiled)

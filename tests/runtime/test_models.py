"""The benchmark models and the transformer block, compiled with ``backend="stax"`` through
``plait.compile`` (eval mode, no gradients) and judged by the conformance gate against eager.

Every node runs natively or as an extern (no fallback); tolerances come from the contract's
"model" row and its float64-anchored rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
from benchmarks.models.gpt2 import GPT2, Block, GPT2Config
from benchmarks.models.mlp import MLP
from benchmarks.models.resnet import resnet18

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-models")]


def _floats(shape: tuple[int, ...], dtype: torch.dtype) -> Callable[[int], Any]:
    def make(seed: int) -> tuple[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(shape, generator=g).to(dtype),)

    return make


def _tokens(shape: tuple[int, ...], vocab: int) -> Callable[[int], Any]:
    def make(seed: int) -> tuple[torch.Tensor]:
        return (torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed)),)

    return make


def check_stax(
    model: nn.Module, factory: Callable[[int], Any], layouts: tuple[str, ...] = ("contiguous",)
) -> None:
    model.eval()
    compiled = plait.compile(model, backend="stax", fullgraph=True)
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda *xs: compiled(*xs), factory, candidate_module=model, op_class="model",
            layouts=layouts, draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    for spec in compiled.specializations:
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0 and counts["native"] > 0, counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_mlp(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    check_stax(MLP(16, 64, 8).to(dtype), _floats((5, 16), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_resnet18(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layouts = ("contiguous", "channels_last")
    check_stax(resnet18(num_classes=10).to(dtype), _floats((2, 3, 32, 32), dtype), layouts)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_gpt2(attention: str) -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32,
                     attention=attention)  # fmt: skip
    check_stax(GPT2(cfg), _tokens((2, 16), 64))


def test_transformer_block() -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(block_size=32, n_head=4, d_model=64)
    check_stax(Block(cfg), _floats((2, 32, 64), torch.float32))


@pytest.mark.slow
def test_benchmark_sizes() -> None:
    """The benchmark's own sizes: ResNet-18 at 224x224, the 2-layer d=768 GPT-2 block."""
    torch.manual_seed(0)
    check_stax(resnet18(), _floats((1, 3, 224, 224), torch.float32))
    cfg = GPT2Config(vocab_size=256, block_size=128, n_layer=2, n_head=12, d_model=768)
    check_stax(GPT2(cfg), _tokens((1, 128), 256))

"""The benchmark models and the transformer block, compiled with ``backend="stax"`` through
``plait.compile`` (eval mode, no gradients) and judged by the conformance gate against eager.

Every node runs natively or as an extern (no fallback); tolerances come from the contract's
"model" row and its float64-anchored rule.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.models.gpt2 import GPT2, Block, GPT2Config
from benchmarks.models.mlp import MLP
from benchmarks.models.resnet import resnet18
from tests.util import check_native, float_inputs, token_inputs

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-models")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_mlp(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    check_native(MLP(16, 64, 8).to(dtype), float_inputs((5, 16), dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_resnet18(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    layouts = ("contiguous", "channels_last")
    check_native(resnet18(num_classes=10).to(dtype), float_inputs((2, 3, 32, 32), dtype), layouts)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_gpt2(attention: str) -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32,
                     attention=attention)  # fmt: skip
    check_native(GPT2(cfg), token_inputs((2, 16), 64))


def test_transformer_block() -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(block_size=32, n_head=4, d_model=64)
    check_native(Block(cfg), float_inputs((2, 32, 64), torch.float32))


@pytest.mark.slow
def test_benchmark_sizes() -> None:
    """The benchmark's own sizes: ResNet-18 at 224x224, the 2-layer d=768 GPT-2 block."""
    torch.manual_seed(0)
    check_native(resnet18(), float_inputs((1, 3, 224, 224), torch.float32))
    cfg = GPT2Config(vocab_size=256, block_size=128, n_layer=2, n_head=12, d_model=768)
    check_native(GPT2(cfg), token_inputs((1, 128), 256))

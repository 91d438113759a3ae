"""The benchmark models and the transformer block, compiled with ``backend="tvm"`` through
``plait.compile`` (eval mode, no gradients) and judged by the conformance gate against eager,
exactly as ``tests/runtime/test_models.py`` judges ``backend="stax"``: fresh random inputs,
tolerances from the contract's "model" row and its float64-anchored rule.

Every node runs natively or as an extern (no fallback to PyTorch), and every kernel the C++
printer would print is printed by TVM (no kernel falls back to the C++ printer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from benchmarks.models.gpt2 import GPT2, Block, GPT2Config
from benchmarks.models.mlp import MLP
from benchmarks.models.resnet import resnet18
from tests.util import check_native, float_inputs, token_inputs

pytestmark = pytest.mark.xdist_group("tvm-models")


def check_tvm(
    model: nn.Module, factory: Callable[[int], Any], layouts: tuple[str, ...] = ("contiguous",)
) -> None:
    compiled = check_native(model, factory, layouts, backend="tvm")
    for spec in compiled.specializations:
        kernels = spec.manifest.kernels["kernels"]
        assert kernels and all(k["printer"] == "tvm" for k in kernels), [
            (k["name"], k.get("fallback")) for k in kernels if k["printer"] != "tvm"
        ]
        assert spec.manifest.fallbacks == []
        assert spec.manifest.toolchain["tvm"]["tvm"].startswith("0.")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_mlp(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    check_tvm(MLP(16, 64, 8).to(dtype), float_inputs((5, 16), dtype))


def test_resnet18() -> None:
    torch.manual_seed(0)
    layouts = ("contiguous", "channels_last")
    check_tvm(resnet18(num_classes=10), float_inputs((2, 3, 32, 32), torch.float32), layouts)


@pytest.mark.parametrize("attention", ["sdpa", "explicit"])
def test_gpt2(attention: str) -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=2, n_head=2, d_model=32,
                     attention=attention)  # fmt: skip
    check_tvm(GPT2(cfg), token_inputs((2, 16), 64))


def test_transformer_block() -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(block_size=32, n_head=4, d_model=64)
    check_tvm(Block(cfg), float_inputs((2, 32, 64), torch.float32))


@pytest.mark.slow
def test_resnet18_bf16_and_benchmark_sizes() -> None:
    """bfloat16 ResNet; the benchmark's own sizes: ResNet-18 at 224x224, the 2-layer d=768
    GPT-2."""
    torch.manual_seed(0)
    layouts = ("contiguous", "channels_last")
    check_tvm(resnet18(num_classes=10).to(torch.bfloat16),
              float_inputs((2, 3, 32, 32), torch.bfloat16), layouts)  # fmt: skip
    check_tvm(resnet18(), float_inputs((1, 3, 224, 224), torch.float32))
    cfg = GPT2Config(vocab_size=256, block_size=128, n_layer=2, n_head=12, d_model=768)
    check_tvm(GPT2(cfg), token_inputs((1, 128), 256))

"""Correct candidates: the gate must pass every one (no false alarms).

Besides eager itself, each is a program rewritten by hand with a legitimately different order of
arithmetic that the contract allows: split-K matmuls, chunked means, two-pass BatchNorm, a softmax
written out, float32 accumulation in another order for a float16 layer.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tests.conformance.models import (
    MLP,
    ConvBN,
    ConvPool,
    HalfLinear,
    LastToken,
    LogRelu,
    SoftmaxHead,
    batch_norm_by_hand,
    center,
    randn,
    seeded,
)
from tests.conformance.mutants import Setup


def split_k_linear(x: torch.Tensor, layer: nn.Linear, chunks: int = 4) -> torch.Tensor:
    """``layer(x)`` as a sum of ``chunks`` partial matmuls, added pairwise: another order of the
    same float32 sum (what a split-K kernel does)."""
    width = x.shape[-1] // chunks
    parts = [
        x[..., k * width : (k + 1) * width] @ layer.weight[:, k * width : (k + 1) * width].T
        for k in range(chunks)
    ]
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0] + layer.bias


def eager(make: Callable[[], nn.Module], example: torch.Tensor, **options: object) -> Setup:
    model = make()
    return Setup(model, model, (example,), dict(options))


def mlp_split_k() -> Setup:
    model = seeded(1, MLP)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        return split_k_linear(torch.relu(split_k_linear(x, model.fc1)), model.fc2)

    return Setup(model, candidate, (randn(8, 16, seed=31),), {"candidate_module": model})


def center_chunked() -> Setup:
    def candidate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        total = x[:, :half].sum(-1, keepdim=True) + x[:, half:].sum(-1, keepdim=True)
        return x - total / x.shape[-1]

    return Setup(center, candidate, (randn(16, 32, seed=32),))


def conv_bn_two_pass() -> Setup:
    model = seeded(2, ConvBN)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        h = batch_norm_by_hand(model.bn, model.conv(x), eps=model.bn.eps)
        return model.fc(torch.relu(h).mean(dim=(2, 3)))

    options = {"candidate_module": model, "layouts": ("contiguous", "channels_last")}
    return Setup(model, candidate, (randn(4, 3, 8, 8, seed=33),), options)


def softmax_written_out() -> Setup:
    model = seeded(7, SoftmaxHead)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        logits = model.fc(x)
        e = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
        return e / e.sum(dim=-1, keepdim=True)

    return Setup(model, candidate, (randn(8, 16, seed=34),), {"candidate_module": model})


def half_linear_float32_split_k() -> Setup:
    model = seeded(5, HalfLinear)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        w = model.fc.weight.float()
        xf = x.float()
        acc = xf[:, 512:] @ w[:, 512:].T + xf[:, :512] @ w[:, :512].T
        return (acc + model.fc.bias.float()).half()

    inputs = (randn(8, 1024, seed=35, dtype=torch.float16),)
    return Setup(model, candidate, inputs, {"candidate_module": model})


def bf16_mlp_fused() -> Setup:
    model = seeded(1, MLP).to(torch.bfloat16)

    def candidate(x: torch.Tensor) -> torch.Tensor:
        # NOTE: a fused kernel: the hidden layer stays float32, one rounding at the end.
        f1, f2 = model.fc1, model.fc2
        hidden = torch.relu(x.float() @ f1.weight.float().T + f1.bias.float())
        return (hidden @ f2.weight.float().T + f2.bias.float()).to(torch.bfloat16)

    inputs = (randn(8, 16, seed=37, dtype=torch.bfloat16),)
    return Setup(model, candidate, inputs, {"candidate_module": model})


def log_relu_clamp() -> Setup:
    model = seeded(8, LogRelu)
    cand = lambda x: torch.clamp(torch.log(x), min=0) * model.w  # NOTE: clamp keeps NaN.
    return Setup(model, cand, (randn(6, 10, seed=36),), {"candidate_module": model})


CORRECT: dict[str, Callable[[], Setup]] = {
    "eager_mlp": lambda: eager(lambda: seeded(1, MLP), randn(8, 16, seed=40), grads=True),
    "eager_conv_bn": lambda: eager(
        lambda: seeded(2, ConvBN), randn(4, 3, 8, 8, seed=41), grads=True,
        layouts=("contiguous", "channels_last"),
    ),
    "eager_conv_pool": lambda: eager(
        lambda: seeded(6, ConvPool), randn(2, 3, 6, 6, seed=42),
        layouts=("contiguous", "channels_last"),
    ),
    "eager_softmax": lambda: eager(
        lambda: seeded(7, SoftmaxHead), randn(8, 16, seed=43), grads=True
    ),
    "eager_last_token": lambda: eager(lambda: seeded(4, LastToken), randn(4, 7, 12, seed=44)),
    "eager_log_relu": lambda: eager(lambda: seeded(8, LogRelu), randn(6, 10, seed=45)),
    "eager_half_linear": lambda: eager(
        lambda: seeded(5, HalfLinear), randn(8, 1024, seed=46, dtype=torch.float16)
    ),
    "mlp_split_k": mlp_split_k,
    "mlp_split_k_grads": lambda: _with(mlp_split_k(), grads=True),
    "center_chunked": center_chunked,
    "conv_bn_two_pass": conv_bn_two_pass,
    "conv_bn_two_pass_grads": lambda: _with(conv_bn_two_pass(), grads=True),
    "softmax_written_out": softmax_written_out,
    "half_linear_float32_split_k": half_linear_float32_split_k,
    "log_relu_clamp": log_relu_clamp,
    "bf16_mlp_fused": bf16_mlp_fused,
    "bf16_mlp_fused_grads": lambda: _with(bf16_mlp_fused(), grads=True),
}  # fmt: skip


def _with(setup: Setup, **options: object) -> Setup:
    setup.options.update(options)
    return setup

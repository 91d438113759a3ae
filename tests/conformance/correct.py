"""Correct candidates: the gate must pass every one (no false alarms).

Besides eager itself, each is a program rewritten by hand with a legitimately different order of
arithmetic that the contract allows: split-K matmuls, chunked means, two-pass BatchNorm, a softmax
written out, float32 accumulation in another order for a float16 layer.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
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
    resnet18_eval,
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


# ResNet-18 as compilers run it on the CPU. Both torch.compile (inductor) and plait fold eval-mode
# BatchNorm into the convolutions and run oneDNN's channels_last (NHWC) convolutions, whose float32
# rounding error is ~2x eager's NCHW kernels' per layer (~1.65x in RMS through ResNet-18): the
# candidates below reproduce that without a compiler (docs/conformance.md, "Deep nets").


def fold_bn(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every eval-mode BatchNorm folded into the conv before it, the fold
    computed in float64 and rounded once: what a fold-bn pass does."""
    folded = copy.deepcopy(model)
    for parent in list(folded.modules()):
        names = list(parent._modules)
        for a, b in itertools.pairwise(names):
            conv, bn = parent._modules[a], parent._modules[b]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                _fold_into(conv, bn)
                parent._modules[b] = nn.Identity()
    return folded


def _fold_into(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> None:
    assert bn.running_mean is not None and bn.running_var is not None
    with torch.no_grad():
        scale = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
        bias = conv.bias.double() if conv.bias is not None else torch.zeros_like(scale)
        shift = bn.bias.double() + (bias - bn.running_mean.double()) * scale
        conv.weight.copy_((conv.weight.double() * scale[:, None, None, None]).float())
        conv.bias = nn.Parameter(shift.float())


class UnfoldConv(nn.Module):
    """A Conv2d computed as im2col (``F.unfold``) and one matmul: the dot products of the conv
    summed by a GEMM in its own blocked order instead of the conv kernel's."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv
        n, _, h, w = x.shape
        (kh, kw), (ph, pw) = c.kernel_size, _pair(c.padding)
        (dh, dw), (sh, sw) = c.dilation, c.stride
        cols = F.unfold(x, c.kernel_size, c.dilation, (ph, pw), c.stride)
        out = c.weight.reshape(c.out_channels, -1) @ cols
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        out = out.reshape(n, c.out_channels, oh, ow)
        return out if c.bias is None else out + c.bias[None, :, None, None]


def _pair(padding: object) -> tuple[int, int]:
    if isinstance(padding, tuple) and all(isinstance(p, int) for p in padding):
        return int(padding[0]), int(padding[1])
    raise ValueError(f"UnfoldConv needs explicit integer padding, got {padding!r}")


def convs_unfolded(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose convolutions run through :class:`UnfoldConv`."""
    out = copy.deepcopy(model)
    for parent in list(out.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, nn.Conv2d):
                parent._modules[name] = UnfoldConv(child)
    return out


def channels_last(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    cl = copy.deepcopy(model).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return lambda x: cl(x.contiguous(memory_format=torch.channels_last))


def folded_channels_last(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    return channels_last(fold_bn(model))


def resnet18_folded_channels_last() -> Setup:
    """ResNet-18 with BatchNorm folded in float64 and channels_last convolutions.

    NOTE: on this example (seed 14) contract 1.0.0, whose baseline was eager in the case's own
    layout alone, failed it (109% of the budget); see test_no_false_alarms.py.
    """
    model = resnet18_eval(0, 32)
    inputs = (randn(2, 3, 32, 32, seed=14),)
    options = {"candidate_module": model, "layouts": ("contiguous", "channels_last")}
    return Setup(model, folded_channels_last(model), inputs, options)


def resnet18_convs_unfolded() -> Setup:
    """ResNet-18 whose convolutions are an im2col and one GEMM each."""
    model = resnet18_eval(0, 32)
    inputs = (randn(2, 3, 32, 32, seed=48),)
    options = {"candidate_module": model, "layouts": ("contiguous", "channels_last")}
    return Setup(model, convs_unfolded(model), inputs, options)


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
    "resnet18_folded_channels_last": resnet18_folded_channels_last,
    "resnet18_convs_unfolded": resnet18_convs_unfolded,
}  # fmt: skip


def _with(setup: Setup, **options: object) -> Setup:
    setup.options.update(options)
    return setup

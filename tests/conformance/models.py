"""Small eager models the gate is tested on, and their example inputs.

Every example is drawn from a seeded generator (never zeros); every model is initialised under a
fixed seed without disturbing the global RNG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def seeded(seed: int, make: Callable[[], M]) -> M:
    """Build a module under ``seed`` without touching the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def randn(*shape: int, seed: int, scale: float = 1.0, dtype: torch.dtype = torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


class MLP(nn.Module):
    """Linear -> ReLU -> Linear: a dense classifier head."""

    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class SquareMLP(MLP):
    """An MLP whose first weight is square, so a transposed weight still type-checks."""

    def __init__(self) -> None:
        super().__init__(d_in=16, hidden=16, d_out=8)


class ConvBN(nn.Module):
    """Conv -> BatchNorm (training mode, running stats) -> ReLU -> global pool -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean(dim=(2, 3)))


class ConvPool(nn.Module):
    """Conv -> ReLU -> per-channel mean over space, flattened through a reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        return h.reshape(h.shape[0], h.shape[1], -1).mean(-1)


class SoftmaxHead(nn.Module):
    """Linear -> softmax: class probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x), dim=-1)


class LastToken(nn.Module):
    """Sequence model that projects the last time step: x[:, -1] @ W."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.tanh(x)[:, -1])


class LogRelu(nn.Module):
    """relu(log(x)) * w: NaN for negative inputs, and the NaN must survive the relu."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(10) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.log(x)) * self.w


class HalfLinear(nn.Module):
    """A float16 linear layer over a long reduction axis (K = 1024)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1024, 16).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def center(x: torch.Tensor) -> torch.Tensor:
    """Subtract the per-row mean: a normalization without parameters."""
    return x - x.mean(dim=-1, keepdim=True)


def batch_norm_by_hand(bn: nn.BatchNorm2d, x: torch.Tensor, *, eps: float, updates: int = 1):
    """Training-mode BatchNorm written out by hand: the shape of a compiled BN kernel.

    Two-pass variance (eager uses its own kernel), so with ``eps=bn.eps, updates=1`` this is a
    correct candidate whose arithmetic differs from eager's. ``updates`` is how many times the
    running statistics are written (1 is right).
    """
    assert bn.num_batches_tracked is not None and bn.running_mean is not None
    assert bn.running_var is not None
    dims = (0, 2, 3)
    n = x.numel() // x.shape[1]
    mean = x.mean(dim=dims)
    var = (x - mean[None, :, None, None]).square().mean(dim=dims)
    scale = bn.weight * torch.rsqrt(var + eps)
    out = (x - mean[None, :, None, None]) * scale[None, :, None, None] + bn.bias[
        None, :, None, None
    ]
    momentum = bn.momentum or 0.0
    with torch.no_grad():
        bn.num_batches_tracked.add_(1)
        for _ in range(updates):
            bn.running_mean.mul_(1 - momentum).add_(mean.detach(), alpha=momentum)
            bn.running_var.mul_(1 - momentum).add_(var.detach() * n / (n - 1), alpha=momentum)
    return out


def resnet18_eval(seed: int = 0, image: int = 32) -> nn.Module:
    """ResNet-18 (benchmarks/models/resnet.py, 10 classes) as the ResNet benchmark builds it:
    seeded init, BatchNorm affine parameters drawn, running statistics calibrated on two
    training-mode batches of ``image``-sized inputs (cumulative average), eval mode."""
    from benchmarks.models.resnet import resnet18

    def make() -> nn.Module:
        model = resnet18(num_classes=10)
        gen = torch.Generator().manual_seed(seed + 1)
        bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        with torch.no_grad():
            for bn in bns:
                bn.weight.uniform_(0.5, 1.5, generator=gen)
                bn.bias.normal_(0.0, 0.1, generator=gen)
                bn.momentum = None  # NOTE: cumulative average: the statistics of the batches.
            model.train()
            for i in range(2):
                model(randn(16, 3, image, image, seed=1000 + i))
            for bn in bns:
                bn.momentum = 0.1
        return model.eval()

    return seeded(seed, make)

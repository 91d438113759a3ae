"""Models for the regional compilation tests: data-dependent branches at several depths, and
stacks of identical blocks."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def line_of(path: str, marker: str) -> int:
    """The line of ``path`` that ends with ``# BRANCH: <marker>``."""
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# BRANCH: {marker}"):
                return n
    raise AssertionError(marker)


class Block(nn.Module):
    """A pre-norm residual MLP block (capturable whole)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * self.fc2(torch.relu(self.fc1(self.norm(x))))


class BranchyParent(nn.Module):
    """Its own forward reads data; its children capture."""

    def __init__(self, d: int = 16, n: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        if h.mean() > 0:  # BRANCH: parent
            h = h * 2
        return self.head(h)


class BranchyChild(nn.Module):
    """Reads data in its own forward; its children (the grandchildren of the model) capture."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.up = nn.Linear(d, d)
        self.down = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if h.max() > 1.0:  # BRANCH: child
            h = torch.tanh(h)
        return self.down(h)


class ChildBranchModel(nn.Module):
    """Captures nowhere whole because of its child ``mid``; ``pre`` and ``post`` capture."""

    def __init__(self, d: int = 12) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.Linear(6, d), nn.GELU())
        self.mid = BranchyChild(d)
        self.post = nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.mid(self.pre(x)))


class LateBranch(nn.Module):
    """Captures whole for small batches; reads data for batches larger than 4."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if x.shape[0] > 4 and bool(h.sum() > 0):  # BRANCH: late
            h = -h
        return self.b(h)


class LateModel(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.body = LateBranch(d)
        self.head = nn.Linear(d, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if h.std() > 0:  # BRANCH: late parent
            h = h + 1
        return self.head(h)


class Scaled(nn.Module):
    """Takes non-tensor arguments and keywords."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0, act: str = "relu") -> torch.Tensor:
        h = self.lin(x) * scale
        return torch.relu(h) if act == "relu" else torch.tanh(h)


class SharedUse(nn.Module):
    """Calls one submodule several times per forward, with keywords and Python values."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.shared = Scaled(d)
        self.other = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, steps: int = 3) -> dict[str, Any]:
        h = x
        for i in range(steps):
            h = self.shared(h, scale=0.5 + i, act="relu" if i % 2 else "tanh")
            if h.abs().sum() == 0:  # BRANCH: shared
                break
        return {"out": self.other(h), "steps": steps}

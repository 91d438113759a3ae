"""A small MLP: Linear → GELU → Dropout → Linear → ReLU → Linear, with a LayerNorm.

Example:
    >>> import torch
    >>> MLP(8, 32, 4)(torch.randn(5, 8)).shape
    torch.Size([5, 4])
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.norm = nn.LayerNorm(d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.act(self.fc1(x)))
        h = torch.relu(self.norm(self.fc2(h)))
        return self.fc3(h)

"""Programs the export tests export: a GPT-2 style transformer block written here (so that a
loading process cannot import it), small benchmark models, and plain functions with keyword
arguments and structured results."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.mlp import MLP
from benchmarks.models.resnet import BasicBlock, ResNet


class TransformerBlock(nn.Module):
    """Pre-LayerNorm causal self-attention and a GELU MLP, each with a residual (GPT-2's)."""

    def __init__(self, d_model: int = 32, n_head: int = 4, seq: int = 16) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln_2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


def scaled(weight: torch.Tensor) -> Callable[..., Any]:
    """A function with a keyword-only argument and a default, closing over a tensor, that
    returns a dict holding a tuple and a plain value."""

    def f(x: torch.Tensor, y: torch.Tensor, *, scale: float = 0.5) -> dict[str, Any]:
        h = torch.tanh(x @ weight) * scale
        return {"h": h, "pair": (h + y, (h * y).sum(dim=-1)), "rows": 2}

    return f


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def cases() -> dict[str, tuple[Any, tuple, dict, dict[str, Any]]]:
    """name -> (model or function, args, kwargs, export options): small sizes."""
    torch.manual_seed(0)
    gen = seeded(1)
    cfg = GPT2Config(vocab_size=64, block_size=16, n_layer=1, n_head=2, d_model=32)
    weight = torch.randn(8, 8, generator=gen)
    return {
        "mlp": (MLP(16, 32, 8).eval(), (torch.randn(4, 16, generator=gen),), {}, {}),
        "gpt2": (GPT2(cfg).eval(), (torch.randint(0, 64, (2, 8), generator=gen),), {}, {}),
        "resnet": (
            ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10).eval(),
            (torch.randn(1, 3, 32, 32, generator=gen),),
            {},
            {},
        ),
        "block": (TransformerBlock().eval(), (torch.randn(2, 16, 32, generator=gen),), {}, {}),
        "function": (
            scaled(weight),
            (torch.randn(3, 8, generator=gen), torch.randn(3, 8, generator=gen)),
            {"scale": 0.25},
            {},
        ),
        "dynamic": (
            MLP(16, 32, 8).eval(),
            (torch.randn(4, 16, generator=gen),),
            {},
            {"dynamic": True},
        ),
    }


def fresh_call(name: str, args: tuple, kwargs: dict, seed: int) -> tuple[tuple, dict]:
    """Fresh random inputs for ``name`` (another batch size for the dynamic export)."""
    gen = seeded(seed)

    def like(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        shape = list(t.shape)
        if name == "dynamic":
            shape[0] = 6
        if t.dtype.is_floating_point:
            return torch.randn(shape, generator=gen, dtype=t.dtype)
        return torch.randint(0, 64, shape, generator=gen, dtype=t.dtype)

    return tuple(like(a) for a in args), {k: like(v) for k, v in kwargs.items()}


def flat_tensors(obj: Any, name: str = "out") -> dict[str, Any]:
    """Every leaf of a nested result, named by its path (the loading process's twin of it)."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flat_tensors(v, f"{name}/{k}"))
        return out
    if isinstance(obj, (tuple, list)):
        out = {}
        for i, v in enumerate(obj):
            out.update(flat_tensors(v, f"{name}/{i}"))
        return out
    return {name: obj}

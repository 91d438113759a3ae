"""Regions answer as eager: identical blocks that differ only in what their Python finds on
them (an attribute read with ``getattr``'s default, ``hasattr``) never share a program, and a
region whose result is a view of its input keeps eager's aliasing when the parent writes
through it."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


class Scaled(nn.Module):
    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        if scale is not None:
            self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * getattr(self, "scale", 1.0)
        return y * (2.0 if hasattr(self, "scale") else -1.0)


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Scaled(), Scaled(3.0), Scaled()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
            if x.abs().sum() > 1e9:  # NOTE: a data-dependent branch: the blocks are regions
                x = x * 0
        return x


class Head(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :4]


class WritesThrough(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.head = nn.Linear(8, 8), Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lin(x).detach()
        if x.sum() > 1e9:
            x = -x
        self.head(x).mul_(0.5)  # NOTE: eager writes into x through the view
        return x


def _judge(model: nn.Module) -> None:
    torch.manual_seed(0)
    model = model.eval()
    ref = copy.deepcopy(model)
    compiled = plait.compile(model, options={"cache": False})
    for seed in range(3):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(seed))
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(x.clone())
            want = ref(x.clone())
        torch.testing.assert_close(got, want, rtol=TOL["rtol"], atol=TOL["atol"])
    assert plait.explain(compiled).regions is not None


def test_blocks_differing_in_an_absent_attribute() -> None:
    torch.manual_seed(0)
    _judge(Blocks())


def test_parent_writes_through_a_region_view() -> None:
    torch.manual_seed(0)
    _judge(WritesThrough())

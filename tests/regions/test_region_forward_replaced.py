"""A region runs the forward its module has now: a forward set on the instance (as accelerate's
hooks and monkeypatches do) or replaced on the class, before the first call or after it, is a
new specialization of that region, never the program captured from the old one; an identical
block with a forward of its own never takes another block's program."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning

TOL = plait.contract.load().tolerance("model", torch.float32)


def _close(got: Any, want: Any) -> None:
    torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


def _x(seed: int) -> torch.Tensor:
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(seed))


def _model() -> tuple[nn.Module, type[nn.Module]]:
    class Block(nn.Module):  # NOTE: a class of its own: a test replaces its forward
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    class Parent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
                if x.abs().sum() == 0:  # NOTE: a data-dependent branch: regions
                    x = x + 1
            return x

    torch.manual_seed(0)
    return Parent().eval(), Block


def _compare(cm: Any, model: nn.Module, seeds: range) -> None:
    for seed in seeds:
        _close(cm(_x(seed)), model(_x(seed)))


def test_a_forward_set_on_the_instance_after_the_first_call_runs() -> None:
    model, _ = _model()
    cm = plait.compile(model, options={"cache": False})
    block = model.blocks[1]
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            _compare(cm, model, range(2))
        block.forward = lambda x: torch.tanh(block.lin(x)) * 3  # type: ignore[method-assign]
        _compare(cm, model, range(2, 5))
        original = type(block).forward
        block.forward = functools.partial(lambda self, x: original(self, x) - 1, block)  # type: ignore[method-assign]
        _compare(cm, model, range(5, 8))
        del block.forward
        _compare(cm, model, range(8, 11))


def test_an_identical_block_with_a_forward_of_its_own_does_not_share() -> None:
    model, _ = _model()
    block = model.blocks[1]
    block.forward = lambda x: torch.tanh(block.lin(x)) * 3  # type: ignore[method-assign]
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning):
        _compare(cm, model, range(3))
    regions = {r["module"]: r for r in plait.explain(cm).regions["regions"]}
    assert regions["blocks.1"]["shares_artifact_with"] == []
    assert regions["blocks.2"]["shares_artifact_with"] == ["blocks.0"]


def test_a_forward_replaced_on_the_class_runs() -> None:
    model, block_class = _model()
    cm = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning):
            _compare(cm, model, range(2))
        block_class.forward = lambda self, x: torch.sigmoid(self.lin(x))  # type: ignore[method-assign]
        _compare(cm, model, range(2, 5))

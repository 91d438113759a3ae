"""A tensor the program computes and keeps in Python state (a module attribute, a global, a
list) is the capture's: a compiled call never sets that state again. Using it after the call
raises a plait error naming what made it, instead of computing with the capture's value (stale
after the first call, never computed where capture skipped the arithmetic). The program's own
outputs are unaffected."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import GraphCaptureError
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


class Stashing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.last = y
        return y.relu()


KEPT: list[Any] = []


def stashing(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x * 2)
    KEPT.append(y)
    return y + 1


def test_a_module_attribute_set_in_forward_is_refused_when_used() -> None:
    torch.manual_seed(0)
    m = Stashing()
    compiled = plait.compile(m, options={"cache": False})
    for seed in (1, 2):
        torch.manual_seed(seed)
        x = torch.randn(3, 6)
        with torch.no_grad():
            got, want = compiled(x), m.lin(x).relu()
        torch.testing.assert_close(got, want, **TOL)
        with pytest.raises(GraphCaptureError, match="kept in Python state"):
            _ = m.last + 0


def test_a_tensor_appended_to_a_global_list_is_refused_when_used() -> None:
    KEPT.clear()
    compiled = plait.compile(stashing, options={"cache": False}, fullgraph=False)
    torch.manual_seed(3)
    x = torch.randn(5)
    with pytest.warns(plait.errors.CaptureFallbackWarning):
        got = compiled(x)
    torch.testing.assert_close(got, torch.tanh(x * 2) + 1, **TOL)
    # NOTE: the program reads the list it appends to: it runs eagerly; what the capture kept
    # is refused, what the eager call appended is the latest value
    captured = [t for t in KEPT if type(t) is not torch.Tensor]
    assert captured, [type(t) for t in KEPT]
    with pytest.raises(GraphCaptureError, match="made by"):
        torch.add(captured[0], 1)
    torch.testing.assert_close(KEPT[-1], torch.tanh(x * 2), **TOL)

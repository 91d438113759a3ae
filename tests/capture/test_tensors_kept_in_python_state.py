"""A tensor the program computes and keeps in Python state (a module attribute, a global, a
list) is the capture's: a compiled call never sets that state again. Using it after the call
raises a plait error naming what made it, instead of computing with the capture's value (stale
after the first call, never computed where capture skipped the arithmetic). The program's own
outputs are unaffected. Where the program also reads that state, its capture is refused and the
tracer it stored is taken out again: the eager run stores eager's tensor."""

from __future__ import annotations

import warnings
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


def test_a_global_list_the_program_reads_and_appends_to_holds_eager_values_only() -> None:
    KEPT.clear()
    compiled = plait.compile(stashing, options={"cache": False}, fullgraph=False)
    for seed in (3, 4):
        torch.manual_seed(seed)
        x = torch.randn(5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", plait.errors.CaptureFallbackWarning)
            got = compiled(x)
        torch.testing.assert_close(got, torch.tanh(x * 2) + 1, **TOL)
        # NOTE: the program reads the list it appends to: it runs eagerly, and the tracer the
        # capture appended is taken out again, so the list holds what eager appended
        assert all(type(t) is torch.Tensor for t in KEPT), [type(t) for t in KEPT]
        assert len(KEPT) == seed - 2
        torch.testing.assert_close(KEPT[-1], torch.tanh(x * 2), **TOL)
    assert compiled.specializations[0].fallback_reason is not None

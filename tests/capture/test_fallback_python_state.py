"""A capture that falls back runs the program's Python once already (on tracer tensors, up to
where it stops); the eager call that follows runs it again. The Python values the capture read
and changed (a counter, a global, a list it appends to) are put back as they were when it first
read them, so each call changes them once, as eager does, and answers as eager does."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

pytestmark = pytest.mark.filterwarnings("ignore::plait.errors.CaptureFallbackWarning")

TOL = contract_tol("model", torch.float32)
STEP = 0


class CountsItsCalls(nn.Module):
    """Reads and changes ``self.calls`` (refused: the eager fallback)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


class CountsThenBranches(CountsItsCalls):
    """Changes ``self.calls`` and appends to a list, then branches on data (run in regions)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global STEP
        self.calls += 1
        STEP += 1
        self.seen.append(x.shape[0])
        y = self.lin(x)
        if y.sum() > 1e9:
            y = -y
        return y * self.calls + STEP


def _calls_match_eager(model: nn.Module, state: Any) -> None:
    global STEP
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, options={"cache": False})
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(3, 4, generator=g)
            start = STEP
            want = reference(x)
            STEP = start
            got = compiled(x)
            torch.testing.assert_close(got, want, **TOL)
            assert state(model) == state(reference)
    assert compiled.specializations[0].fallback_reason is not None


def test_a_refused_counter_counts_each_call_once() -> None:
    _calls_match_eager(CountsItsCalls(), lambda m: m.calls)


def test_python_state_changed_before_a_data_read_changes_once_per_call() -> None:
    _calls_match_eager(CountsThenBranches(), lambda m: (m.calls, m.seen))

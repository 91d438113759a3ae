"""The call whose capture falls back runs the program's Python twice (docs/capture.md, "Known
limitation"): its Python side effects happen twice in that call. Pinned as a known defect, and
beside it the case that rules out putting back what the capture changed: an install-once flag
whose hooks stay installed."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


@pytest.mark.xfail(strict=True, reason="the call that falls back runs the program's Python twice")
def test_a_refused_counter_counts_each_call_once() -> None:
    torch.manual_seed(0)
    model, twin = Counter().eval(), Counter().eval()
    twin.load_state_dict(model.state_dict())
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for _ in range(3):
            x = torch.randn(2, 4, generator=gen)
            torch.testing.assert_close(compiled(x), twin(x))
    assert model.calls == twin.calls


class HookedOnce(nn.Module):
    """Installs a forward hook on its child the first time it runs (a flag guards it), as
    transformers' output recording does, then reads tensor data (the capture falls back)."""

    def __init__(self) -> None:
        super().__init__()
        self.child = nn.Linear(4, 4)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "_hooked", False):
            self.child.register_forward_hook(lambda m, a, out: self.seen.append(out))
            self._hooked = True
        self.seen.clear()
        y = self.child(x)
        return y * 2 if bool(y.sum() > 0) else y


def test_an_install_once_hook_records_each_output_once() -> None:
    torch.manual_seed(2)
    model = HookedOnce().eval()
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for _ in range(3):
            compiled(torch.randn(2, 4, generator=gen))
            assert len(model.seen) == 1

"""A module holding a TorchScript submodule (``torch.jit.script`` or ``torch.jit.trace``)
cannot be captured through it: the call is the loud eager fallback naming the submodule
(``fullgraph=True`` raises), never a crash; its results are eager's."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import contract_tol

NO_CACHE = {"cache": False}


class _Holder(nn.Module):
    def __init__(self, scripted: nn.Module) -> None:
        super().__init__()
        self.inner = scripted
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.inner(x).relu())


def _scripted(kind: str) -> nn.Module:
    lin = nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # NOTE: TorchScript's deprecation
        if kind == "script":
            return torch.jit.script(lin)
        return torch.jit.trace(lin, torch.randn(2, 4))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kind", ["script", "trace"])
def test_a_torchscript_submodule_runs_eagerly_with_a_warning(kind: str) -> None:
    model = _Holder(_scripted(kind)).eval()
    compiled = plait.compile(model, options=NO_CACHE)
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning) as caught:
        for _ in range(2):
            x = torch.randn(5, 4)
            # NOTE: the head may run as a compiled region
            torch.testing.assert_close(
                compiled(x), model(x), **contract_tol("model", torch.float32)
            )
    assert any("TorchScript module" in str(w.message) for w in caught), caught.list


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fullgraph_names_the_torchscript_submodule() -> None:
    compiled = plait.compile(_Holder(_scripted("script")), fullgraph=True, options=NO_CACHE)
    with torch.no_grad(), pytest.raises(GraphCaptureError, match="inner is a TorchScript module"):
        compiled(torch.randn(5, 4))

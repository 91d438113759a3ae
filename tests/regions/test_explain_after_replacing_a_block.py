"""``plait.explain`` after a block of the model was replaced by another module: the regions and
boundaries it lists are the module's as it is now (the replaced block's engine is not listed
beside its successor, under the same path), and a boundary that every specialization of the
root shares is listed once."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import plait
from tests.regions import models
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


class Other(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def test_a_replaced_block_is_listed_once_as_what_replaced_it() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=3).eval()
    cm = plait.compile(model, backend="eager", options={"cache": False})
    gen = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            cm(torch.randn(4, 8, generator=gen))
        cm(torch.randn(4, 8, generator=gen))  # NOTE: grad mode: the root specializes again
        model.blocks[1] = Other(16)
        for _ in range(2):  # NOTE: the first is refused again and goes on eagerly
            x = torch.randn(4, 8, generator=gen)
            torch.testing.assert_close(cm(x), model(x), **TOL)
    report = plait.explain(cm).regions
    listed = [(r["module"], r["class"]) for r in report["regions"]]
    assert len(listed) == len(set(p for p, _ in listed)), listed
    assert ("blocks.1", "Other") in listed
    block1 = next(r for r in report["regions"] if r["module"] == "blocks.1")
    assert block1["not_shared"] is None  # NOTE: no identical block: nothing to share
    assert "blocks.1" not in {p for r in report["regions"] for p in r["shares_artifact_with"]}
    root = [b for b in report["boundaries"] if b["module"] == ""]
    assert len(root) == 1, root

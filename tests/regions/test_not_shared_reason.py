"""``plait.explain``'s ``not_shared`` says why a block's latest program is its own: a block that
took an identical block's program (in grad mode after a no-grad call) reports no reason, and
neither does the block that captured it (its own earlier program is no identical block's)."""

from __future__ import annotations

import warnings

import torch

import plait
from tests.regions import models


def test_blocks_sharing_in_a_new_grad_mode_report_no_reason() -> None:
    torch.manual_seed(0)
    model = models.BranchyParent(n=3).eval()
    cm = plait.compile(model, backend="eager", options={"cache": False})
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            cm(x)  # NOTE: refused, it goes on eagerly: the regions compile on the next call
            cm(x)
        cm(x)  # NOTE: grad mode: the root is captured again, refused, goes on eagerly
        cm(x)
    report = plait.explain(cm).regions
    blocks = {r["module"]: r for r in report["regions"] if r["module"].startswith("blocks.")}
    assert {p: r["specializations"] for p, r in blocks.items()} == {
        "blocks.0": 2,
        "blocks.1": 2,
        "blocks.2": 2,
    }
    assert {p: r["not_shared"] for p, r in blocks.items()} == dict.fromkeys(blocks)
    assert report["sharing"]["programs_shared"] == 4  # NOTE: blocks 1 and 2, in each mode

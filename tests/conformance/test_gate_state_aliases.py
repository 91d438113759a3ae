"""An output that is a parameter's or buffer's memory must be so in both programs: a candidate
that hands out a weight where eager returns a copy fails the gate (the caller's write to the
output would change the model); a copy of what eager returns as a weight's view is a
warning."""

from __future__ import annotations

import torch
from torch import nn

import plait
from plait.conformance import check
from tests.conformance.models import randn


class Scaled(nn.Module):
    """Returns its input scaled, and its table: a copy, or (``view=True``) the table itself."""

    def __init__(self, view: bool) -> None:
        super().__init__()
        self.view = view
        self.table = nn.Parameter(randn(4, 3, seed=3))
        self.register_buffer("shift", randn(3, seed=4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        table = self.table if self.view else self.table.clone()
        shift = self.shift[:2] if self.view else self.shift[:2].clone()
        return x * 2, table, shift


def _pair(view_ref: bool, view_cand: bool) -> tuple[nn.Module, nn.Module]:
    ref, cand = Scaled(view_ref), Scaled(view_cand)
    cand.load_state_dict(ref.state_dict())
    return ref, cand


def test_a_weight_handed_out_where_eager_copies_it_fails() -> None:
    ref, cand = _pair(False, True)
    with torch.no_grad():
        report = check(ref, cand, (randn(4, 3, seed=1),))
    assert not report.ok
    # NOTE: the calls' check sees the weight handed out twice too; this one names the weight
    named = {f.where for f in report.errors if "aliases a parameter or buffer" in f.message}
    assert named == {"output[1]", "output[2]"}, str(report)


def test_a_copy_of_eagers_weight_view_warns() -> None:
    ref, cand = _pair(True, False)
    with torch.no_grad():
        report = check(ref, cand, (randn(4, 3, seed=1),))
    assert report.ok, str(report)
    warned = {f.where for f in report.warnings if f.check == "alias"}
    assert warned == {"output[1]", "output[2]"}, str(report)


def test_plait_keeps_eagers_weight_views_and_copies() -> None:
    for view in (False, True):
        model = Scaled(view)
        with torch.no_grad():
            report = check(model, plait.compile(model), (randn(4, 3, seed=2),))
        assert report.ok and not report.warnings, str(report)

"""``F.cross_entropy`` in a program with symbolic dims (``plait.frontend.lower_loss``): a
classifier's training step with its loss inside the compiled module runs one symbolic
specialization at every batch size, forward and backward native, judged by the gate (loss and
gradients) with ignored targets among fresh ones; the reductions; a target out of range raises
as eager's does; a static capture keeps ATen's program."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.conformance
from tests.dynamic.loss_checks import judged_at_sizes


class _Classifier(torch.nn.Module):
    def __init__(self, reduction: str) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU())
        self.head = torch.nn.Linear(32, 7)
        self.reduction = reduction

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(self.body(x)), target, reduction=self.reduction)


def _batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 7, (n,), generator=g)
    target[torch.randperm(n, generator=g)[: n // 3]] = -100  # NOTE: ignored, as padding is
    return torch.randn(n, 12, generator=g), target


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_a_classifier_trains_symbolically_through_its_loss(reduction: str) -> None:
    torch.manual_seed(0)
    model = _Classifier(reduction)
    batches = lambda n: lambda seed: _batch(n, seed)
    manifest, ops = judged_at_sizes(model, batches, (5, 9, 17, 30))
    assert "backward" in manifest.executor, manifest.executor.keys()
    assert "aten" not in ops, ops


def test_a_target_out_of_range_raises_as_in_eager() -> None:
    model = _Classifier("mean")
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    x, target = _batch(6, 1)
    compiled(x, target)
    target[2] = 7
    with pytest.raises(IndexError):
        F.cross_entropy(model.head(model.body(x)), target)
    with pytest.raises(IndexError):
        compiled(x, target)


def test_a_static_capture_keeps_atens_program() -> None:
    model = _Classifier("mean")
    compiled = plait.compile(model, dynamic=False, options={"cache": False})
    compiled(*_batch(6, 2))
    (spec,) = plait.explain(compiled).specializations
    ops = {n["op"] for n in spec.manifest.executor["evidence"]["nodes"]}
    assert "aten" in ops and "index_select" not in ops, ops

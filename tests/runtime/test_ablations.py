"""Stax's ablation knobs (``StaxOptions``): each combination still conforms to eager, and each
knob changes what the manifest says it did."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance

pytestmark = pytest.mark.usefixtures("stax_cache")


def _conv_relu_conv() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)
    ).eval()


def _images(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed)),)


def _compile(model: nn.Module, **stax: Any) -> dict[str, Any]:
    """Compile through ``plait.compile`` with ``stax`` options, judge it against eager on fresh
    inputs, and return the Stax manifest records."""
    compiled = plait.compile(model, backend="stax", fullgraph=True, options={"stax": stax})
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda x: compiled(x), _images, candidate_module=model, op_class="model",
            draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    (spec,) = compiled.specializations
    records: dict[str, Any] = spec.manifest.executor
    return records


@pytest.mark.parametrize(
    ("inplace", "infer_layouts"), list(itertools.product([True, False], repeat=2))
)
def test_conv_relu_conv_layouts(inplace: bool, infer_layouts: bool) -> None:
    """Regression: with ``inplace=False`` an arena buffer ignored the channels_last layout
    learned for the value it held (outputs off by ~1.2)."""
    _compile(_conv_relu_conv(), inplace=inplace, infer_layouts=infer_layouts)

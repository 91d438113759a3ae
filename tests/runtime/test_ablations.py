"""Stax's ablation knobs (``StaxOptions``): each combination still conforms to eager, and each
knob changes what the manifest says it did."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
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
    return {**spec.manifest.executor, "kernels": spec.manifest.kernels["kernels"]}


@pytest.mark.parametrize("fuse", [True, False], ids=["fuse", "nofuse"])
@pytest.mark.parametrize(
    ("inplace", "infer_layouts"), list(itertools.product([True, False], repeat=2))
)
def test_conv_relu_conv_layouts(inplace: bool, infer_layouts: bool, fuse: bool) -> None:
    """Regression: with ``inplace=False`` an arena buffer ignored the channels_last layout
    learned for the value it held (outputs off by ~1.2): the relu between the convs, stored in
    the arena, was handed to the second conv as a contiguous view of channels_last bytes."""
    _compile(_conv_relu_conv(), inplace=inplace, infer_layouts=infer_layouts, fuse=fuse)


class _Net(nn.Module):
    """A pointwise prologue (arena), conv + relu (relu native: never a oneDNN post-op), conv +
    silu (oneDNN post-op), a residual add (in place, channels_last), a reduction, linear,
    softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv1(x * 0.5 + 0.25))
        z = F.silu(self.conv2(y)) + y
        return torch.softmax(self.fc(z.mean((2, 3))), -1)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return _Net().eval()


def _details(records: dict[str, Any]) -> list[str]:
    return [n["detail"] for n in records["evidence"]["nodes"]]


def _homes(records: dict[str, Any]) -> set[str]:
    return {b["home"] for b in records["memory_plan"]["buffers"]}


def test_defaults_record_every_knob() -> None:
    rec = _compile(_net())
    assert {k: rec["options"][k] for k in ("fuse", "memory_plan", "channels_last")} == {
        "fuse": True, "memory_plan": True, "channels_last": True,
    }  # fmt: skip
    assert any("oneDNN post-op" in d for d in _details(rec))
    assert any(len(k["nodes"]) > 1 for k in rec["kernels"])
    assert {"arena", "inplace"} <= _homes(rec) and rec["memory_plan"]["reuse"]
    assert any("conv2d channels_last" in d for d in _details(rec))


def test_fuse_off_runs_each_node_alone() -> None:
    # NOTE: the linear stays the library's in both (with fuse on, plait's native kernel would
    # run it, a native node more in the base to compare with)
    base, rec = _compile(_net(), pointwise=False), _compile(_net(), fuse=False, pointwise=False)
    assert rec["options"]["fuse"] is False
    assert not any("oneDNN post-op" in d or "fused" in d for d in _details(rec))
    assert all(len(k["nodes"]) == 1 for k in rec["kernels"])
    assert len(rec["kernels"]) > len(base["kernels"])
    assert rec["evidence"]["counts"]["native"] > base["evidence"]["counts"]["native"]


def test_memory_plan_off_allocates_fresh() -> None:
    base, rec = _compile(_net()), _compile(_net(), memory_plan=False)
    assert rec["options"]["memory_plan"] is False
    mp = rec["memory_plan"]
    assert mp["reuse"] is False and mp["arena_bytes"] == 0
    assert "fresh" in _homes(rec) and not _homes(rec) & {"arena", "inplace"}
    assert mp["peak_live_bytes"] >= base["memory_plan"]["peak_live_bytes"]


def test_channels_last_off_keeps_activations_contiguous() -> None:
    rec = _compile(_net(), channels_last=False)
    assert rec["options"]["channels_last"] is False
    details = _details(rec)
    assert any("conv2d contiguous" in d for d in details)
    assert not any("channels_last" in d for d in details)


def test_all_knobs_off() -> None:
    _compile(_net(), fuse=False, memory_plan=False, channels_last=False, inplace=False)

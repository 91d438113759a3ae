"""A type rule that cannot relate a symbolic size restarts the capture with the size it names
static, not a size of another dim that merely equals a static size of the call (a height of 64
beside a convolution's 64 output channels)."""

from __future__ import annotations

import torch

import plait
import plait.conformance


def _conv() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU()).eval()


def test_a_height_equal_to_the_output_channels_stays_symbolic() -> None:
    """``dynamic=True`` makes the channels symbolic; the conv's rule (``s1 != 3``) names them
    only, so the height (8, as many as the weight's output channels) stays symbolic and one
    specialization serves every image size."""
    model = _conv()
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    for b, h in ((2, 8), (4, 11), (2, 16)):
        with torch.no_grad():
            report = plait.conformance.check(
                model, compiled, (torch.randn(b, 3, h, h),), draws=1, candidate_module=model
            )
        assert report.ok, f"{b}x{h}: {report}"
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    (x,) = [v for v in compiled.specializations[0].graph.inputs if v.kind == "user"]
    assert x.type.shape[1] == 3 and not isinstance(x.type.shape[2], int), x.type

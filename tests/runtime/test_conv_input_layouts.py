"""A conv's input that a native kernel of another shape makes (a zero pad before a strided or
depthwise conv, as Hugging Face's MobileNetV2 and EfficientNet pad) is written channels_last,
the layout the oneDNN conv reads: no layout copy at each call, and eager's values. (With
plait's depthwise kernel, the default, that pad is folded into the depthwise call instead:
``tests/codegen/test_depthwise_conv.py``; here it is turned off, and so are plait's 1x1 and
stem kernels.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import plait
import plait.conformance

pytestmark = pytest.mark.usefixtures("stax_cache")


class _PadConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, stride=2, groups=8)
        self.c = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(torch.relu(self.a(x)), (0, 1, 0, 1))
        return self.c(F.relu6(self.b(y)))


def _images(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 9, 9, generator=torch.Generator().manual_seed(seed)),)


def test_padded_conv_input_is_written_in_the_conv_layout() -> None:
    torch.manual_seed(0)
    model = _PadConv().eval()
    options = {"stax": {"depthwise": False, "pointwise": False, "stem": False}}
    compiled = plait.compile(model, backend="stax", fullgraph=True, options=options)
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda x: compiled(x), _images, candidate_module=model, op_class="model",
            draws=2,
        )  # fmt: skip
        assert report.ok, str(report)
        (x,) = _images(7)
        compiled(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            compiled(x)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts.get("mkldnn::_convolution_pointwise") == 3  # NOTE: every conv ran in oneDNN
    # NOTE: two layout copies: the program's NCHW input into channels_last for the first conv,
    # and the last conv's channels_last result into eager's NCHW (the call returns eager's
    # memory format); the padded activation is already channels_last
    assert counts.get("aten::contiguous") == 2, counts

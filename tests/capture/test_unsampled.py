"""Capture that skips the arithmetic of convolutions, linear layers, batch norms and max pools
(``arithmetic="skip"``, plait.compile's capture) gives the graph a computing capture gives, and
captures again computing every call where anything reads what it skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from benchmarks.models.resnet import resnet18
from plait.errors import GraphCaptureError
from plait.frontend import capture_program
from plait.ir import to_text
from tests.util import contract_tol


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu_(self.bn(self.conv(x)))
        y = nn.functional.max_pool2d(y, 2)
        y.add_(1.0)  # NOTE: an in-place call on a skipped result
        return self.fc(y.flatten(1))


class _Residual(nn.Module):
    """A skipped result written into a computed tensor in place."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = x * 2
        buf.add_(self.conv(x))
        return buf.sum(dim=1)


def _models() -> list[tuple[str, nn.Module, Callable[[], torch.Tensor]]]:
    return [
        ("convnet", _ConvNet().eval(), lambda: torch.randn(2, 3, 8, 8)),
        ("resnet18", resnet18(num_classes=7).eval(), lambda: torch.randn(1, 3, 64, 64)),
        ("residual", _Residual().eval(), lambda: torch.randn(2, 4, 6, 6)),
    ]


@pytest.mark.parametrize("name", [m[0] for m in _models()])
def test_skipping_capture_gives_the_computing_capture_graph(name: str) -> None:
    _, model, make = next(m for m in _models() if m[0] == name)
    x = make()
    with torch.no_grad():
        skipped = capture_program(model, (x,), arithmetic="skip")
        computed = capture_program(model, (x,), arithmetic="run")
    assert skipped.resampled is None
    assert skipped.uncomputed > 0 and computed.uncomputed == 0
    assert skipped.semantic_hash == computed.semantic_hash
    assert to_text(skipped.graph) == to_text(computed.graph)


def test_channels_last_operands_are_computed() -> None:
    """Eager's result layout is certain only for row-major operands: others run for real."""
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        plain = capture_program(conv, (x,), arithmetic="skip")
        nhwc = capture_program(conv, (x.to(memory_format=torch.channels_last),), arithmetic="skip")
    assert plain.uncomputed == 1
    assert nhwc.uncomputed == 0 and nhwc.resampled is None


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.mean() > 0:  # NOTE: a read of a skipped result's values
            return y * 2
        return y * 3


class _WrittenThenRead(_Residual):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = x * 2
        buf.add_(self.conv(x))  # NOTE: buf now holds what capture did not compute
        return buf * float(buf.max())


_READS: list[tuple[str, Callable[[nn.Conv2d, torch.Tensor], Any]]] = [
    ("nonzero", lambda conv, x: torch.nonzero(conv(x) > 0)),
    ("rfft", lambda conv, x: torch.fft.rfft(conv(x)).abs()),
    ("bucketize", lambda conv, x: torch.bucketize(conv(x), torch.linspace(-1, 1, 5))),
]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("model", [_Branches, _WrittenThenRead], ids=["branch", "written"])
def test_a_read_of_skipped_values_captures_again(model: type[nn.Module], fullgraph: bool) -> None:
    """The program reads values capture skipped: it captures again, computing every call, and
    ends as a computing capture ends (the same fallback, or the same error)."""
    m = model().eval() if model is _Branches else _WrittenThenRead().eval()
    x = torch.randn(2, 3 if model is _Branches else 4, 6, 6)
    outcomes = []
    for arithmetic in ("skip", "run"):
        try:
            prog = capture_program(m, (x,), fullgraph=fullgraph, arithmetic=arithmetic)
        except GraphCaptureError as exc:
            outcomes.append((arithmetic, "error", str(exc)))
            continue
        if arithmetic == "skip":
            assert prog.resampled is not None and "Resample" in prog.resampled
        outcomes.append((arithmetic, "fallback", prog.fallback_reason))
    assert outcomes[0][1:] == outcomes[1][1:]
    assert outcomes[0][1] == ("error" if fullgraph else "fallback")


@pytest.mark.parametrize("name", [r[0] for r in _READS])
def test_calls_that_read_values_capture_again(name: str) -> None:
    """Calls with no capture rule, and sizes set by values, run on a computed sample."""
    read = dict(_READS)[name]
    conv = nn.Conv2d(3, 3, 3, padding=1)
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        skipped = capture_program(lambda t: read(conv, t), (x,), fullgraph=False, arithmetic="skip")
        computed = capture_program(lambda t: read(conv, t), (x,), fullgraph=False)
    assert skipped.resampled is not None
    assert to_text(skipped.graph) == to_text(computed.graph)


def test_unknown_arithmetic_is_refused() -> None:
    with pytest.raises(plait.errors.InvalidOptionError, match="arithmetic"):
        capture_program(lambda t: t + 1, (torch.randn(2),), arithmetic="none")


@pytest.mark.parametrize("name", [m[0] for m in _models()])
def test_compiled_from_a_skipping_capture_matches_eager(name: str) -> None:
    _, model, make = next(m for m in _models() if m[0] == name)
    compiled = plait.compile(model)
    with torch.no_grad():
        compiled(make())  # NOTE: captured on this sample; checked on fresh ones
        for _ in range(3):
            x = make()
            torch.testing.assert_close(
                compiled(x), model(x), **contract_tol("model", torch.float32)
            )
    assert compiled.specializations[0].program.uncomputed > 0

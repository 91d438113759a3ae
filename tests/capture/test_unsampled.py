"""Capture that skips the arithmetic of convolutions, linear layers, batch norms and max pools
(``arithmetic="skip"``, plait.compile's capture) gives the graph a computing capture gives, and
captures again computing every call where anything reads what it skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
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


# --- programs whose capture must not depend on skipping ----------------------------------------
_W = torch.randn(4, 3, 3, 3)


def _outcome(fn: Callable[..., Any], args: tuple, arithmetic: str, **kw: Any) -> tuple:
    try:
        with torch.no_grad():
            prog = capture_program(fn, args, arithmetic=arithmetic, **kw)
    except Exception as exc:  # NOTE: eager's own error, or capture's
        return ("error", type(exc).__name__)
    if prog.graph is None:
        return ("fallback", prog.fallback_reason)
    return ("graph", to_text(prog.graph), str(prog.guards))


class _AutocastInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.fc(x)


class _LayoutBranch(nn.Module):
    """A 1x1 convolution whose channels_last weight is also is_contiguous(): eager's result
    is channels_last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if y.is_contiguous():
            return y.view(y.shape[0], -1) * 2
        return y.reshape(y.shape[0], -1) * 3


class _CaughtIndexError(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        nn.init.zeros_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        self.table = nn.Parameter(torch.randn(10, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = (self.fc(x) * 1e30).long()  # NOTE: 0 in eager; out of range for most garbage
        try:
            return self.table[idx]
        except IndexError:
            return torch.zeros(x.shape[0], 4, 3)


def _setitem_then_read(x: torch.Tensor) -> torch.Tensor:
    buf = torch.zeros(4, 4)
    buf[:] = F.linear(torch.ones(4, 4), torch.ones(4, 4))  # NOTE: returns None, writes buf
    if torch.equal(buf, torch.full((4, 4), 4.0)):
        return x + 1
    return x - 1


def _running_stats_then_read(x: torch.Tensor) -> torch.Tensor:
    rm, rv = torch.zeros(4), torch.ones(4)
    F.batch_norm(F.linear(torch.ones(2, 4), torch.ones(4, 4)), rm, rv, training=True, momentum=1.0)
    if torch.equal(rm, torch.full((4,), 4.0)):
        return x + 1
    return x - 1


_IMG = (torch.randn(2, 3, 6, 6),)
_PROGRAMS: dict[str, tuple[Callable[..., Any], tuple]] = {
    "autocast entered inside": (_AutocastInside().eval(), (torch.randn(2, 8),)),
    "channels_last 1x1 weight": (
        _LayoutBranch().eval().to(memory_format=torch.channels_last),
        (torch.randn(2, 3, 5, 5),),
    ),
    "caught IndexError": (_CaughtIndexError().eval(), (torch.randn(2, 4),)),
    "setitem then a constant read": (_setitem_then_read, (torch.randn(3),)),
    "running stats then a constant read": (_running_stats_then_read, (torch.randn(3),)),
    "conv2d groups not dividing": (lambda t: F.conv2d(t, torch.ones(4, 1, 3, 3), groups=3), _IMG),
    "conv2d same padding, stride 2": (
        lambda t: F.conv2d(t, torch.ones(4, 3, 3, 3), stride=2, padding="same"),
        _IMG,
    ),
    "conv2d kernel over the input": (lambda t: F.conv2d(t, torch.ones(4, 3, 7, 7)), _IMG),
    "conv2d negative padding": (lambda t: F.conv2d(t, _W, padding=-1), _IMG),
    "conv2d stride 0": (lambda t: F.conv2d(t, _W, stride=0), _IMG),
    "max_pool2d to nothing": (lambda t: F.max_pool2d(t, 7), _IMG),
    "batch_norm float64 stats": (
        lambda t: F.batch_norm(
            t, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
        ),
        _IMG,
    ),
    "hardtanh in place, min over max": (
        lambda t: F.hardtanh(F.conv2d(t, _W), 2.0, 1.0, inplace=True),
        _IMG,
    ),
    "relu_ into an expanded view": (
        lambda t: F.conv2d(t, _W)[:, :1].expand(-1, 4, -1, -1).relu_(),
        _IMG,
    ),
    "sub_ of a bool tensor": (
        lambda t: F.conv2d(t, _W).sub_(torch.ones(1, dtype=torch.bool)),
        _IMG,
    ),
}


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("name", sorted(_PROGRAMS))
def test_skipping_never_changes_the_outcome(name: str, fullgraph: bool) -> None:
    """Autocast entered inside the program, layouts, writes that return no tensor, errors the
    program catches, and eager's argument checks: each capture ends as a computing one."""
    fn, args = _PROGRAMS[name]
    for _ in range(3):  # NOTE: garbage differs between runs
        skipped = _outcome(fn, args, "skip", fullgraph=fullgraph)
        assert skipped == _outcome(fn, args, "run", fullgraph=fullgraph), name


def _dropped_then_read(x: torch.Tensor) -> torch.Tensor:
    F.linear(torch.ones(4, 4), torch.ones(4, 4))  # NOTE: skipped, and freed at once
    c = torch.full((4, 4), 4.0)  # NOTE: computed; its memory may be the freed result's
    if torch.equal(c, torch.full((4, 4), 4.0)):
        return x + 1
    return x - 1


def test_a_freed_skipped_result_leaves_no_garbage_behind() -> None:
    """A computed tensor that takes the memory of a freed skipped result is not garbage: its
    read needs no second capture."""
    for _ in range(5):
        prog = capture_program(_dropped_then_read, (torch.randn(3),), arithmetic="skip")
        assert prog.uncomputed == 1 and prog.resampled is None

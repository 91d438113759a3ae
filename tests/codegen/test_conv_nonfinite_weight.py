"""A convolution weight holding inf or NaN, where the zero padding meets it.

oneDNN (plait's fast path) skips the padding; eager's default algorithm for a contiguous input at
many shapes multiplies it: 0 * inf = NaN there. plait's promise is eager's answer, so a weight
that is not all finite (a program input, checked once per tensor version; or a frozen constant,
checked at compile time) runs eager's dispatch on a contiguous input; finite weights keep oneDNN.
Judged with the special-value rule of :mod:`tests.codegen.test_special_values` (NaN where eager
has NaN, the same infinities, finite values within the contract's conv budget).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen.extern import PreparedWeight
from tests.codegen.test_special_values import assert_matches_eager

# NOTE: (stride, padding, dilation, groups): the OpInfo sample eager's default path gives NaNs
# for, and a plain strided one.
GEOMETRIES = [((3, 2), (2, 1), (4, 4), 2), ((2, 2), (2, 2), (1, 1), 1), ((1, 1), (1, 1), (1, 1), 1)]


def _poison(w: torch.Tensor, gen: torch.Generator) -> None:
    """inf, -inf and NaN at random places of ``w`` (in place)."""
    flat = w.view(-1)
    where = torch.randperm(flat.numel(), generator=gen)[:3]
    for i, v in zip(where.tolist(), (float("inf"), float("-inf"), float("nan")), strict=True):
        flat[i] = v


def _details(compiled: object) -> str:
    spec = compiled.specializations[-1]  # type: ignore[attr-defined]
    return json.dumps(spec.manifest.deterministic(), default=str)


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "s{}p{}d{}g{}".format(*g))
def test_weight_input_with_nonfinite_values(
    geometry: tuple[tuple[int, int], tuple[int, int], tuple[int, int], int],
) -> None:
    stride, padding, dilation, groups = geometry

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    gen = torch.Generator().manual_seed(3)
    cf = plait.compile(f, backend="stax")
    shapes = ((2, 4, 10, 9), (4, 4 // groups, 3, 3), (4,))
    with torch.no_grad():
        for draw in range(4):
            x, w, b = (torch.randn(s, generator=gen) for s in shapes)
            if draw % 2:
                _poison(w, gen)
            # NOTE: the same weight tensor written in place between calls (its version moves)
            got = cf(x, w, b)
            assert_matches_eager([got], [[f(x, w, b)]], "conv", f"draw {draw}")
            _poison(w, gen)
            assert_matches_eager([cf(x, w, b)], [[f(x, w, b)]], "conv", f"draw {draw} in place")
    assert "non-finite value runs aten.conv2d" in _details(cf)


class ConvThen(nn.Module):
    """conv -> sigmoid (a fused post-op) and conv + residual (a fused binary post-op)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, stride=2, padding=2)
        self.b = nn.Conv2d(4, 4, 3, padding=2, dilation=2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sigmoid(self.a(x)), torch.tanh(self.b(x) + x)


@pytest.mark.usefixtures("stax_cache")
def test_frozen_weight_with_nonfinite_values() -> None:
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    model = ConvThen().eval()
    with torch.no_grad():
        _poison(model.a.weight, gen)
        _poison(model.b.weight, gen)
    cf = plait.compile(model, backend="stax")
    with torch.no_grad():
        for draw in range(3):
            x = torch.randn(2, 4, 8, 8, generator=gen)
            got = cf(x)
            want = model(x)
            assert bool(want[0].isnan().any()) and bool(want[1].isnan().any())
            assert_matches_eager(list(got), [list(want)], "conv", f"draw {draw}")
    assert "the constant weight is not all finite" in _details(cf)


def test_a_warm_start_keeps_a_frozen_weight_not_all_finite_on_eagers_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry records each conv weight's finiteness with its pack; a warm start takes it
    from there (it reads no weight again) and still runs eager's algorithm for this one."""
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    model = ConvThen().eval()
    with torch.no_grad():
        _poison(model.a.weight, gen)
    options = {"cache": str(tmp_path / "cache")}
    xs = [torch.randn(2, 4, 8, 8, generator=gen) for _ in range(3)]
    with torch.no_grad():
        plait.compile(model, backend="stax", options=options)(xs[0])

        def unread(self: PreparedWeight, w: torch.Tensor) -> None:
            if self.track_finite:
                raise AssertionError("a weight's finiteness was read again on a warm start")

        monkeypatch.setattr(PreparedWeight, "_read_finite", unread)
        warm = plait.compile(model, backend="stax", options=options)
        for draw, x in enumerate(xs):
            got, want = warm(x), model(x)
            assert bool(want[0].isnan().any())
            assert_matches_eager(list(got), [list(want)], "conv", f"warm draw {draw}")
    spec = warm.specializations[-1]
    assert spec.manifest.cache["status"] == "hit"
    finite = {k: w.finite for k, (w, _) in spec.compiled.program.plan.packs.made.items()}
    assert sorted(finite.values()) == [False, True], finite


@pytest.mark.usefixtures("stax_cache")
def test_finite_weights_keep_onednn() -> None:
    torch.manual_seed(0)
    model = ConvThen().eval()
    cf = plait.compile(model, backend="stax")
    with torch.no_grad():
        x = torch.randn(2, 4, 8, 8)
        assert_matches_eager(list(cf(x)), [list(model(x))], "conv", "finite")
    text = _details(cf)
    if torch.backends.mkldnn.is_available():
        assert "oneDNN conv2d" in text and "the constant weight is not all finite" not in text

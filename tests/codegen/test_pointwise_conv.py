"""Where plait's native 1x1 kernel is off (``StaxOptions.pointwise``, or a CPU without
AVX-512; ``tests/codegen/test_pointwise_native.py`` tests the kernel), a 1x1 convolution of a few
pixels (a squeeze-and-excitation block's) runs MKL's packed GEMM of its channels_last rows, its
activation a native kernel (``plait.codegen.pointwise_conv``); on a larger map it stays oneDNN's
convolution. Either way it answers as eager within the contract's
conv budget on fresh inputs, keeps eager's special values for a weight that is not all finite,
and sees a weight written in place between calls. A costly value a kernel would compute again
for each element it reads it at (the gate's sigmoid, per pixel of a channels_last map it scales)
is computed once into a buffer instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen.onednn_postops import FEW_ROWS, mkl_linear_available
from tests.cache.helpers import status
from tests.codegen.test_special_values import assert_matches_eager
from tests.util import contract_tol

pytestmark = pytest.mark.skipif(not mkl_linear_available(), reason="needs MKL's packed linear")
ROWS = "1x1 conv2d as MKL's packed linear"
# NOTE: without plait's native 1x1 kernel (the path of a CPU without AVX-512)
OFF = {"pointwise": False}


class SqueezeExcite(nn.Module):
    """An inverted-residual block's middle: a depthwise convolution (its result channels_last),
    torchvision's squeeze-and-excitation gate (pool, 1x1 conv, SiLU, 1x1 conv, sigmoid, scale)
    and the projection (a 1x1 convolution of the scaled map, which reads it channels_last)."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.project = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        s = F.adaptive_avg_pool2d(x, 1)
        return self.project(x * torch.sigmoid(self.expand(F.silu(self.reduce(s)))))


def _conv_details(compiled: Any) -> list[str]:
    """What the running program reports for each of its convolutions."""
    program = compiled.specializations[-1].compiled.program
    nodes = [getattr(s, "node", None) for s in program.plan.steps]
    return [
        program.evidence.nodes[n.id].detail for n in nodes if n is not None and n.op == "conv2d"
    ]


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("batch", [1, 3])
def test_squeeze_excite_runs_mkl_rows_and_matches_eager(batch: int) -> None:
    torch.manual_seed(0)
    model = SqueezeExcite(96, 24).eval()
    compiled = plait.compile(model, backend="stax", options={"stax": OFF})
    gen = torch.Generator().manual_seed(batch)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(batch, 96, 14, 14, generator=gen)
            torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    details = _conv_details(compiled)
    assert len(details) == 4 and all(d.startswith(ROWS) for d in details[1:3]), details
    assert not details[3].startswith(ROWS), details  # NOTE: the projection's 196 rows
    # NOTE: SiLU, the gate's sigmoid (per channel, not per pixel of the channels_last map), scale
    assert len(compiled.specializations[-1].compiled.program.kernels) == 3


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("side", [4, 5])
def test_a_map_of_more_rows_keeps_onednn_conv(side: int) -> None:
    """4x4 is FEW_ROWS pixels: the rows' GEMM; 5x5 is more: oneDNN's convolution. Both as eager."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(32, 48, 1), nn.Sigmoid()).eval()
    compiled = plait.compile(model, backend="stax", options={"stax": OFF})
    gen = torch.Generator().manual_seed(side)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 32, side, side, generator=gen)
            torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    (detail,) = _conv_details(compiled)
    assert detail.startswith(ROWS) == (side * side <= FEW_ROWS), detail


@pytest.mark.usefixtures("stax_cache")
def test_weight_input_written_in_place_and_nonfinite() -> None:
    """A weight passed to the program: packed on first use, packed again once written in place;
    a weight with inf or NaN runs eager's convolution (its special values)."""

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b)

    gen = torch.Generator().manual_seed(7)
    compiled = plait.compile(f, backend="stax", options={"stax": OFF})
    w = torch.randn(16, 8, 1, 1, generator=gen)
    b = torch.randn(16, generator=gen)
    with torch.no_grad():
        for draw in range(4):
            x = torch.randn(2, 8, 1, 1, generator=gen)
            if draw == 2:
                w.view(-1)[3] = float("nan")
                w.view(-1)[17] = float("inf")
            elif draw:
                w.mul_(torch.randn(w.shape, generator=gen))
            assert_matches_eager([compiled(x, w, b)], [[f(x, w, b)]], "conv", f"draw {draw}")
    (detail,) = _conv_details(compiled)
    assert detail.startswith(ROWS), detail


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize(
    ("gate", "layout", "kernels"),
    [
        ((1, 1, 1, 6), torch.contiguous_format, 2),
        ((1, 8, 1, 1), torch.contiguous_format, 1),
    ],
    ids=["varies-inner", "per-row"],
)
def test_a_costly_value_read_broadcast(
    gate: tuple[int, ...], layout: torch.memory_format, kernels: int
) -> None:
    """sigmoid of a gate scaling a [1, 8, 6, 6] map: one varying along the map's innermost dim
    gets its own kernel (6 sigmoids, not 288 inside the scaling kernel); one constant along it
    stays inline, hoisted out of the inner loop (tests/codegen/test_fusion.py)."""

    def f(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(g)

    compiled = plait.compile(f, backend="stax")
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 8, 6, 6, generator=gen).contiguous(memory_format=layout)
            g = torch.randn(gate, generator=gen)
            torch.testing.assert_close(
                compiled(x, g), f(x, g), **contract_tol("pointwise", torch.float32)
            )
    program = compiled.specializations[-1].compiled.program
    assert len(program.kernels) == kernels, [k.name for k in program.kernels]


def test_a_warm_start_packs_the_rows_again_and_answers_as_eager(tmp_path: Path) -> None:
    """MKL's packed bytes are its own format for this CPU: a cache entry never carries them, so a
    warm start (the entry's plan rebuilt, nothing captured again but the program) packs again."""
    cache = str(tmp_path / "cache")
    torch.manual_seed(2)
    cold = plait.compile(SqueezeExcite(32, 8).eval(), options={"cache": cache, "stax": OFF})
    with torch.no_grad():
        cold(torch.randn(2, 32, 7, 7))
    assert status(cold.specializations[-1]) == "miss"
    torch.manual_seed(2)
    model = SqueezeExcite(32, 8).eval()
    warm = plait.compile(model, options={"cache": cache, "stax": OFF})
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 32, 7, 7, generator=gen)
            torch.testing.assert_close(warm(x), model(x), **contract_tol("conv", torch.float32))
    assert status(warm.specializations[-1]) == "hit"
    rows = [d for d in _conv_details(warm) if d.startswith(ROWS)]
    assert len(rows) == 2 and all("at load, in the background" in d for d in rows), rows


@pytest.mark.usefixtures("stax_cache")
def test_with_mkl_linear_off_the_gate_convolutions_run_onednn_with_post_ops() -> None:
    torch.manual_seed(3)
    model = SqueezeExcite(32, 8).eval()
    compiled = plait.compile(model, options={"cache": False, "stax": {**OFF, "mkl_linear": False}})
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 32, 9, 9, generator=gen)
            torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    details = _conv_details(compiled)
    assert not [d for d in details if d.startswith(ROWS)], details
    # NOTE: the gate's SiLU and sigmoid as oneDNN post-ops of its two convolutions
    assert "fused swish" in details[1] and "fused sigmoid" in details[2], details

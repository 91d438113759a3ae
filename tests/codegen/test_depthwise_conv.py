"""A float32 depthwise convolution (3x3 or 5x5, stride 1 or 2) runs plait's native kernel
(``plait.codegen.depthwise_conv``) with the zero pad and the clamp-family activation before it
and the activation after it folded in, and answers as eager: within the contract's conv budget
on fresh inputs (MobileNet-V2's and EfficientNet-B0's shapes, odd sizes, stride 2 on odd maps,
batches), NaN and infinities where eager has them, eager's ops for a weight that is not all
finite. An activation something else also reads stays its own kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen import pointwise_native
from tests.cache.helpers import status
from tests.codegen.native_conv_helpers import node_details, special_values
from tests.codegen.test_special_values import assert_matches_eager
from tests.util import assert_bitwise, contract_tol, torch_threads

NATIVE = "native depthwise"


class InvertedResidual(nn.Module):
    """Hugging Face's MobileNetV2 block: 1x1 expansion, ReLU6, an explicit TF-"same" zero pad,
    the depthwise convolution (no padding of its own), ReLU6, 1x1 projection; or, with
    ``own_padding``, torchvision's (the convolution pads itself), EfficientNet's (SiLU) or
    MobileNetV3's (Hardswish)."""

    def __init__(self, c: int, k: int, s: int, act: str = "relu6", own_padding: bool = False):
        super().__init__()
        self.k, self.s, self.own = k, s, own_padding
        self.expand = nn.Conv2d(8, c, 1)
        pad = k // 2 if own_padding else 0
        self.dw = nn.Conv2d(c, c, k, s, pad, groups=c)
        self.project = nn.Conv2d(c, 8, 1)
        self.act = {"relu6": nn.ReLU6(), "silu": nn.SiLU(), "hardswish": nn.Hardswish()}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.act(self.expand(x))
        if not self.own:
            h, w = v.shape[-2:]
            ph = max(self.k - (self.s if h % self.s == 0 else h % self.s), 0)
            pw = max(self.k - (self.s if w % self.s == 0 else w % self.s), 0)
            v = F.pad(v, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        return self.project(self.act(self.dw(v)))


def _check(model: nn.Module, shape: tuple[int, ...], seed: int) -> Any:
    model.eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(shape, generator=gen) * 3
            torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    return compiled


# NOTE: (channels, map, kernel, stride): MobileNet-V2's and EfficientNet-B0's depthwise shapes
# (the larger maps cut down), odd maps, channels that are no multiple of 16
SHAPES = [
    (32, 56, 3, 1), (96, 56, 3, 2), (144, 28, 3, 2), (192, 14, 3, 1), (960, 7, 3, 1),
    (240, 14, 5, 1), (672, 14, 5, 2), (1152, 7, 5, 1), (20, 9, 3, 2), (3, 11, 5, 2),
    (17, 13, 3, 1), (40, 5, 5, 1),
]  # fmt: skip


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("channels,side,k,s", SHAPES)
def test_mobilenet_block_runs_native_depthwise_and_matches_eager(
    channels: int, side: int, k: int, s: int
) -> None:
    torch.manual_seed(channels + side)
    compiled = _check(InvertedResidual(channels, k, s), (2, 8, side, side + 2), seed=side)
    details = node_details(compiled)
    (dw,) = [d for key, d in details.items() if key.startswith("conv2d") and NATIVE in d]
    assert "folded: clamp" in dw and "constant_pad" in dw, dw
    folded = [key for key, d in details.items() if d.startswith("folded into node")]
    assert sorted(key.split("#")[0] for key in folded) == ["clamp", "clamp", "constant_pad"]
    # NOTE: no kernel is left between the expansion and the projection
    assert len(compiled.specializations[-1].compiled.program.kernels) == 0


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("act", ["relu6", "silu", "hardswish"])
def test_own_padding_and_silu_match_eager(act: str) -> None:
    """torchvision's block (the convolution pads itself), EfficientNet's SiLU and MobileNetV3's
    Hardswish: the activation before the convolution is the expansion's (folded into plait's 1x1
    call where the CPU has AVX-512, else a oneDNN post-op, which has no Hardswish), the one after
    it is folded."""
    torch.manual_seed(3)
    model = InvertedResidual(48, 5, 2, act, own_padding=True)
    details = node_details(_check(model, (1, 8, 15, 17), seed=4))
    (dw,) = [d for d in details.values() if NATIVE in d]
    folded = [key.split("#")[0] for key, d in details.items() if d.startswith("folded into")]
    both = ["clamp", "clamp"] if act == "relu6" else [act, act]
    want = both if act == "relu6" or pointwise_native.available() else both[:1]
    assert folded == want, (folded, dw)


class SharedActivation(nn.Module):
    """The ReLU6 before the depthwise convolution is read by a residual sum too: it must be
    written, so it is not folded into the convolution's loads."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(32, 32, 3, 1, 1, groups=32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = F.relu6(x)
        return F.relu6(self.dw(v)) + v


@pytest.mark.usefixtures("stax_cache")
def test_activation_read_elsewhere_is_not_folded() -> None:
    torch.manual_seed(5)
    details = node_details(_check(SharedActivation(), (1, 32, 10, 12), seed=6))
    assert any(NATIVE in d for d in details.values()), details
    clamps = [d.startswith("folded into") for key, d in details.items() if key.startswith("clamp")]
    assert sorted(clamps) == [False, True], details  # NOTE: the output's ReLU6 only


class Depthwise(nn.Module):
    """The depthwise part alone: ReLU6, zero pad, depthwise convolution, ReLU6."""

    def __init__(self, c: int, k: int, s: int) -> None:
        super().__init__()
        self.k = k
        self.dw = nn.Conv2d(c, c, k, s, groups=c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.k // 2
        return F.relu6(self.dw(F.pad(F.relu6(x), (p, p, p, p))))


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("k,s", [(3, 1), (3, 2), (5, 2)])
def test_nan_and_infinities_with_relu6_folded_match_eager(k: int, s: int) -> None:
    """NaN stays NaN through both folded ReLU6s (oneDNN's clip post-op would make it 0), an
    infinity clamps to 6 before the convolution; eager's separate ops are the reference."""
    torch.manual_seed(k * 10 + s)
    model = Depthwise(32, k, s).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _ in range(3):
            x = special_values((2, 32, 9, 13), gen)
            want = model(x)
            assert_matches_eager([compiled(x)], [[want]], "conv", "relu6-pad-dw-relu6")
    assert any(NATIVE in d for d in node_details(compiled).values())


class DepthwiseAct(nn.Module):
    """EfficientNet's depthwise convolution and the SiLU after it, or MobileNetV3's and its
    Hardswish (folded into the stores)."""

    def __init__(self, c: int, k: int, s: int, act: str) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, k, s, k // 2, groups=c)
        self.act = F.silu if act == "silu" else F.hardswish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dw(x))


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("act", ["silu", "hardswish"])
@pytest.mark.parametrize("c,k,s", [(48, 3, 1), (40, 5, 2)])
def test_folded_silu_matches_eager_on_large_and_special_values(
    c: int, k: int, s: int, act: str
) -> None:
    """The SiLU or Hardswish folded into the stores: NaN stays NaN, -inf gives NaN (SiLU's
    -inf / inf, Hardswish's -inf * 0), outputs past exp's overflow and underflow bounds and past
    Hardswish's bounds (inputs scaled by 60) match eager's; 40 channels leave 8 to the channels'
    tail (masked lanes on AVX-512)."""
    torch.manual_seed(c + k + s)
    model = DepthwiseAct(c, k, s, act).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for scale in (1.0, 60.0):
            x = special_values((2, c, 9, 13), gen) * scale
            want = model(x)
            assert_matches_eager([compiled(x)], [[want]], "conv", f"dw-{act} x{scale}")
    (dw,) = [d for d in node_details(compiled).values() if NATIVE in d]
    assert f"folded: {act}" in dw, dw


@pytest.mark.usefixtures("stax_cache")
def test_nan_output_of_unclamped_depthwise_matches_eager() -> None:
    """Without activations, a NaN or infinity of the input reaches each output whose taps read
    it (inf + -inf is NaN): as eager's sum."""
    torch.manual_seed(8)
    model = nn.Conv2d(16, 16, 3, 1, 1, groups=16).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for _ in range(3):
            x = special_values((1, 16, 8, 8), gen)
            assert_matches_eager([compiled(x)], [[model(x)]], "conv", "dw")
    assert any(NATIVE in d for d in node_details(compiled).values())


@pytest.mark.usefixtures("stax_cache")
def test_infinite_weight_runs_eager_ops() -> None:
    """An infinite tap times a padded zero is NaN in eager's sum: such a weight runs eager's
    ops (the kernel skips padded taps)."""
    torch.manual_seed(10)
    model = Depthwise(16, 3, 1).eval()
    with torch.no_grad():
        model.dw.weight[3, 0, 0, 0] = float("inf")
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 16, 6, 6, generator=gen)
            want = model(x)
            assert bool(want.isnan().any())
            assert_matches_eager([compiled(x)], [[want]], "conv", "inf weight")


@pytest.mark.usefixtures("stax_cache")
def test_turned_off_runs_onednn() -> None:
    torch.manual_seed(12)
    model = InvertedResidual(32, 3, 2).eval()
    compiled = plait.compile(model, backend="stax", options={"stax": {"depthwise": False}})
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        x = torch.randn(1, 8, 12, 12, generator=gen)
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    assert not any(NATIVE in d for d in node_details(compiled).values())


@pytest.mark.usefixtures("stax_cache")
def test_warm_start_from_the_cache_runs_the_native_call_bitwise(tmp_path: Path) -> None:
    """A second compile loads the artifact (the plan replayed, the kernel from the kernel
    cache): the same native call, the cold program's bits."""
    torch.manual_seed(14)
    model = InvertedResidual(48, 3, 2).eval()
    x = torch.randn(1, 8, 15, 15, generator=torch.Generator().manual_seed(15))
    results = []
    for expected in ("miss", "hit"):
        compiled = plait.compile(model, backend="stax", options={"cache": str(tmp_path)})
        with torch.no_grad():
            results.append(compiled(x))
        assert status(compiled.specializations[-1]) == expected
        assert any(NATIVE in d for d in node_details(compiled).values())
    assert_bitwise(results[1], results[0], "warm against cold")


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("channels,side,k,s", [(192, 14, 3, 1), (960, 7, 5, 1), (17, 13, 3, 2)])
def test_two_threads_match_one(channels: int, side: int, k: int, s: int) -> None:
    """Calls of every size above a few thousand outputs split their rows over threads (each
    thread reads the pixels the 1x1 call before it wrote there): each output is still one
    thread's sum, in the same order."""
    torch.manual_seed(channels)
    model = InvertedResidual(channels, k, s, act="silu", own_padding=True).eval()
    compiled = plait.compile(model, backend="stax")
    x = torch.randn(2, 8, side, side + 2, generator=torch.Generator().manual_seed(side))
    with torch.no_grad():
        with torch_threads(1):
            one = compiled(x)
        with torch_threads(2):
            two = compiled(x)
        torch.testing.assert_close(one, model(x), **contract_tol("conv", torch.float32))
    assert_bitwise(two, one, "two threads against one")

"""A network's stem convolution (few input channels, reading the caller's tensor) runs plait's
native kernel (``plait.codegen.stem_conv``) on a CPU with AVX-512, reading the input where it
lies, with the zero pad before it and the activation after it folded in, and answers as eager:
within the contract's conv budget on fresh inputs (Hugging Face's TF-"same" pad, torchvision's
own padding, stride 1 and 2, odd sizes, batches, a channels_last input), NaN and infinities
where eager has them, eager's ops for a weight that is not all finite. A convolution of a
computed value, or of more taps than the kernel takes, stays oneDNN's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen.stem_conv import MAX_TAPS, available
from tests.cache.helpers import status
from tests.codegen.native_conv_helpers import node_details, special_values
from tests.codegen.test_special_values import assert_matches_eager
from tests.util import assert_bitwise, contract_tol

pytestmark = [
    pytest.mark.usefixtures("stax_cache"),
    pytest.mark.skipif(not available(), reason="the native stem kernel needs AVX-512"),
]
NATIVE = "native stem conv2d"
ACTS = {"none": lambda v: v, "relu6": F.relu6, "silu": F.silu, "relu": F.relu,
        "hardswish": F.hardswish}  # fmt: skip


class Stem(nn.Module):
    """A stem: (``tf_pad``) Hugging Face's explicit zero pad of one more row and column at the
    end, then the convolution (else its own padding), batch norm, an activation."""

    def __init__(self, cin: int, cout: int, k: int, s: int, act: str, tf_pad: bool) -> None:
        super().__init__()
        self.tf_pad = tf_pad
        self.conv = nn.Conv2d(cin, cout, k, s, 0 if tf_pad else k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = ACTS[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tf_pad:
            x = F.pad(x, (0, 1, 0, 1))
        return self.act(self.bn(self.conv(x)))


def _folded(compiled: Any) -> list[str]:
    return sorted(k.split("#")[0] for k, d in node_details(compiled).items() if "native conv" in d)


def _model(cin: int, cout: int, k: int, s: int, act: str, tf_pad: bool) -> nn.Module:
    model = Stem(cin, cout, k, s, act, tf_pad).eval()
    with torch.no_grad():  # NOTE: statistics that are not the identity (folded into the weight)
        model.bn.running_mean.normal_(0, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def _check(model: nn.Module, shape: tuple[int, ...], seed: int, layout: Any = None) -> Any:
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(shape, generator=gen) * 2
            x = x.contiguous(memory_format=layout) if layout is not None else x
            got, want = compiled(x), model(x)
            torch.testing.assert_close(got, want, **contract_tol("conv", torch.float32))
    return compiled


# NOTE: (in, out, kernel, stride, map): MobileNet's and EfficientNet's stem (map cut down), odd
# maps, output channels that are no multiple of 16, more than 64 of them, one input channel
CASES = [
    (3, 32, 3, 2, 33), (3, 32, 3, 2, 40), (3, 24, 3, 1, 17), (3, 70, 3, 2, 21),
    (1, 16, 5, 2, 19), (2, 8, 3, 1, 9),
]  # fmt: skip


@pytest.mark.parametrize("cin,cout,k,s,side", CASES)
@pytest.mark.parametrize(
    "act,tf_pad", [("relu6", True), ("silu", True), ("hardswish", False), ("none", False)]
)
def test_stems_match_eager(
    cin: int, cout: int, k: int, s: int, side: int, act: str, tf_pad: bool
) -> None:
    torch.manual_seed(cin * 100 + cout + side)
    compiled = _check(_model(cin, cout, k, s, act, tf_pad), (2, cin, side, side + 3), seed=side)
    details = node_details(compiled)
    (stem,) = [d for d in details.values() if d.startswith(NATIVE)]
    want = (["constant_pad"] if tf_pad else []) + {
        "none": [],
        "relu6": ["clamp"],
        "silu": ["silu"],
        "hardswish": ["hardswish"],
    }[act]
    assert _folded(compiled) == sorted(want), details
    assert len(compiled.specializations[-1].compiled.program.kernels) == 0, stem


def test_a_channels_last_input_matches_eager() -> None:
    torch.manual_seed(1)
    compiled = _check(_model(3, 32, 3, 2, "relu", False), (1, 3, 30, 30), 2, torch.channels_last)
    assert any(d.startswith(NATIVE) for d in node_details(compiled).values())


@pytest.mark.parametrize("act", ["relu6", "silu", "hardswish", "none"])
def test_nan_and_infinities_match_eager(act: str) -> None:
    torch.manual_seed(3)
    model = _model(3, 32, 3, 2, act, True)
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _ in range(3):
            x = special_values((2, 3, 15, 16), gen)
            assert_matches_eager([compiled(x)], [[model(x)]], "conv", f"stem+{act}")
    assert any(d.startswith(NATIVE) for d in node_details(compiled).values())


def test_infinite_weight_runs_eager_ops() -> None:
    """A padded zero times an infinite tap is NaN in eager's sum (the kernel skips the tap)."""
    torch.manual_seed(5)
    model = _model(3, 16, 3, 2, "none", True)
    with torch.no_grad():
        model.conv.weight[2, 1, 2, 2] = float("inf")
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(1, 3, 8, 8, generator=gen)
            want = model(x)
            assert bool(want.isnan().any())
            assert_matches_eager([compiled(x)], [[want]], "conv", "inf weight")


class Computed(nn.Module):
    """The convolution reads a value the program computes: oneDNN's (its layout is the plan's)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x * 0.5 + 1.0)


def test_a_computed_input_or_many_taps_stay_onednn() -> None:
    torch.manual_seed(7)
    for model, shape in ((Computed(), (1, 3, 12, 12)), (nn.Conv2d(4, 8, 3, 1, 1), (1, 4, 9, 9))):
        compiled = _check(model.eval(), shape, seed=8)
        assert not any(d.startswith(NATIVE) for d in node_details(compiled).values())
    assert MAX_TAPS < 4 * 3 * 3


def test_turned_off_runs_onednn() -> None:
    torch.manual_seed(9)
    model = _model(3, 32, 3, 2, "relu6", True)
    compiled = plait.compile(model, backend="stax", options={"stax": {"stem": False}})
    gen = torch.Generator().manual_seed(10)
    with torch.no_grad():
        x = torch.randn(1, 3, 14, 14, generator=gen)
        tol = contract_tol("conv", torch.float32)
        torch.testing.assert_close(compiled(x), model(x), **tol)
    assert not any(d.startswith(NATIVE) for d in node_details(compiled).values())


def test_warm_start_from_the_cache_runs_the_native_call_bitwise(tmp_path: Path) -> None:
    torch.manual_seed(11)
    model = _model(3, 32, 3, 2, "silu", True)
    x = torch.randn(1, 3, 21, 21, generator=torch.Generator().manual_seed(12))
    results = []
    for expected in ("miss", "hit"):
        compiled = plait.compile(model, backend="stax", options={"cache": str(tmp_path)})
        with torch.no_grad():
            results.append(compiled(x))
        assert status(compiled.specializations[-1]) == expected
        assert any(d.startswith(NATIVE) for d in node_details(compiled).values())
    assert_bitwise(results[1], results[0], "warm against cold")


def test_two_threads_match_one() -> None:
    torch.manual_seed(13)
    model = _model(3, 32, 3, 2, "relu6", True)
    compiled = plait.compile(model, backend="stax")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(14))
    threads = torch.get_num_threads()
    with torch.no_grad():
        try:
            torch.set_num_threads(1)
            one = compiled(x)
            torch.set_num_threads(2)
            two = compiled(x)
        finally:
            torch.set_num_threads(threads)
        torch.testing.assert_close(one, model(x), **contract_tol("conv", torch.float32))
    assert_bitwise(two, one, "two threads against one")

"""A float32 1x1 convolution runs plait's native kernel (``plait.codegen.pointwise_native``) on
a CPU with AVX-512, with the residual add and the clamp-family or SiLU activation after it
folded in, and answers as eager: within the contract's conv budget on fresh inputs (MobileNet's
shapes, channel counts that are no multiple of 16, batches, a 1x1 map), NaN and infinities
where eager has them, eager's ops for a weight that is not all finite, a weight written in
place read again. A residual computed after the convolution is added where it exists; a
result something else also reads is not folded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen.pointwise_native import available
from tests.cache.helpers import status
from tests.codegen.native_conv_helpers import node_details, special_values_match
from tests.codegen.test_special_values import assert_matches_eager
from tests.util import assert_bitwise, contract_tol

pytestmark = [
    pytest.mark.usefixtures("stax_cache"),
    pytest.mark.skipif(not available(), reason="the native 1x1 kernel needs AVX-512"),
]
NATIVE = "native 1x1 conv2d"
ACTS = {"none": lambda v: v, "relu": F.relu, "relu6": F.relu6, "silu": F.silu,
        "hardswish": F.hardswish, "clamp": lambda v: v.clamp(-1.0, 2.5)}  # fmt: skip


class Projection(nn.Module):
    """A 1x1 convolution, then (``residual``) the block's input added, then an activation."""

    def __init__(self, cin: int, cout: int, act: str, residual: bool, bias: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, bias=bias)
        self.act, self.residual = ACTS[act], residual

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.act(y + r if self.residual else y)


def _folded(compiled: Any) -> list[str]:
    return sorted(k.split("#")[0] for k, d in node_details(compiled).items() if "native conv" in d)


def _check(model: nn.Module, shapes: list[tuple[int, ...]], seed: int, calls: int = 3) -> Any:
    model.eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(calls):
            args = [torch.randn(s, generator=gen) * 3 for s in shapes]
            got, want = compiled(*args), model(*args)
            torch.testing.assert_close(got, want, **contract_tol("conv", torch.float32))
    assert any(NATIVE in d for d in node_details(compiled).values()), node_details(compiled)
    return compiled


# NOTE: (in, out, side): MobileNet-V2's projections and expansions (maps cut down), channel
# counts that are no multiple of 16 on either side, a 1x1 map
SHAPES = [
    (96, 24, 14), (24, 144, 9), (576, 160, 7), (160, 960, 5), (32, 16, 11), (3, 5, 6),
    (17, 40, 13), (320, 1280, 3), (70, 33, 1),
]  # fmt: skip


@pytest.mark.parametrize("cin,cout,side", SHAPES)
@pytest.mark.parametrize(
    "act,residual", [("none", True), ("relu6", False), ("silu", True), ("hardswish", False)]
)
def test_shapes_and_epilogues_match_eager(
    cin: int, cout: int, side: int, act: str, residual: bool
) -> None:
    torch.manual_seed(cin + cout + side)
    model = Projection(cin, cout, act, residual)
    compiled = _check(model, [(2, cin, side, side + 1), (2, cout, side, side + 1)], seed=side)
    folded_act = {"none": [], "relu6": ["clamp"], "silu": ["silu"], "hardswish": ["hardswish"]}[act]
    want = (["add"] if residual else []) + folded_act
    assert _folded(compiled) == sorted(want), node_details(compiled)


@pytest.mark.parametrize("act", ["relu", "clamp"])
def test_no_bias_and_clamp_bounds_match_eager(act: str) -> None:
    torch.manual_seed(1)
    model = Projection(40, 72, act, residual=True, bias=False)
    compiled = _check(model, [(1, 40, 10, 10), (1, 72, 10, 10)], seed=2)
    assert _folded(compiled) == ["add", "clamp" if act == "clamp" else "relu"]


@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "hardswish"])
def test_nan_and_infinities_match_eager(act: str) -> None:
    """NaN stays NaN through a folded ReLU (oneDNN's post-op would make it 0); an infinity of
    the input or the residual reaches the outputs eager's do."""
    torch.manual_seed(3)
    model = Projection(32, 24, act, residual=True).eval()
    shapes = [(2, 32, 6, 7), (2, 24, 6, 7)]
    compiled = special_values_match(model, shapes, "conv", f"1x1+add+{act}", 4)
    assert any(NATIVE in d for d in node_details(compiled).values())


def test_infinite_weight_runs_eager_ops() -> None:
    torch.manual_seed(5)
    model = Projection(16, 20, "relu", residual=True).eval()
    with torch.no_grad():
        model.conv.weight[3, 2, 0, 0] = float("inf")
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for _ in range(2):
            x, r = torch.randn(1, 16, 5, 5, generator=gen), torch.randn(1, 20, 5, 5, generator=gen)
            want = model(x, r)
            assert bool(want.isinf().any() or want.isnan().any())
            assert_matches_eager([compiled(x, r)], [[want]], "conv", "inf weight")


def test_weight_written_in_place_is_read_again() -> None:
    torch.manual_seed(7)
    model = Projection(24, 48, "relu6", residual=False).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        x, r = torch.randn(1, 24, 6, 6, generator=gen), torch.randn(1, 48, 6, 6, generator=gen)
        compiled(x, r)
        model.conv.weight.mul_(torch.rand(model.conv.weight.shape, generator=gen) + 0.5)
        model.conv.bias.add_(torch.randn(48, generator=gen))
        got, want = compiled(x, r), model(x, r)
        torch.testing.assert_close(got, want, **contract_tol("conv", torch.float32))


class LateResidual(nn.Module):
    """A bottleneck's tail: the residual (a strided 1x1 downsampling convolution) is computed
    after the convolution whose result it is added to, then ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(16, 24, 3, 2, 1)
        self.expand = nn.Conv2d(24, 64, 1)
        self.down = nn.Conv2d(16, 64, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.expand(F.relu(self.reduce(x)))
        return F.relu(y + self.down(x))


def test_residual_computed_after_the_convolution_matches_eager() -> None:
    torch.manual_seed(9)
    compiled = _check(LateResidual(), [(2, 16, 14, 12)], seed=10)
    assert _folded(compiled) == ["add", "relu"], node_details(compiled)


class SharedResult(nn.Module):
    """The convolution's result is read twice: nothing is folded into its call."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(32, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return F.relu(y + x) * y


def test_result_read_elsewhere_is_not_folded() -> None:
    torch.manual_seed(11)
    compiled = _check(SharedResult(), [(1, 32, 8, 8)], seed=12)
    assert _folded(compiled) == []


def test_residual_in_another_layout_matches_eager() -> None:
    """The residual is the caller's contiguous (NCHW) tensor: read through a channels_last
    copy."""
    torch.manual_seed(13)
    compiled = _check(Projection(48, 32, "none", residual=True), [(3, 48, 7, 9), (3, 32, 7, 9)], 14)
    assert _folded(compiled) == ["add"]


def test_turned_off_runs_onednn() -> None:
    torch.manual_seed(15)
    model = Projection(24, 40, "none", residual=True).eval()
    compiled = plait.compile(model, backend="stax", options={"stax": {"pointwise": False}})
    gen = torch.Generator().manual_seed(16)
    with torch.no_grad():
        x, r = torch.randn(1, 24, 9, 9, generator=gen), torch.randn(1, 40, 9, 9, generator=gen)
        tol = contract_tol("conv", torch.float32)
        torch.testing.assert_close(compiled(x, r), model(x, r), **tol)
    assert not any(NATIVE in d for d in node_details(compiled).values())


def test_warm_start_from_the_cache_runs_the_native_call_bitwise(tmp_path: Path) -> None:
    torch.manual_seed(17)
    model = Projection(64, 24, "relu6", residual=True).eval()
    gen = torch.Generator().manual_seed(18)
    x, r = torch.randn(1, 64, 11, 11, generator=gen), torch.randn(1, 24, 11, 11, generator=gen)
    results = []
    for expected in ("miss", "hit"):
        compiled = plait.compile(model, backend="stax", options={"cache": str(tmp_path)})
        with torch.no_grad():
            results.append(compiled(x, r))
        assert status(compiled.specializations[-1]) == expected
        assert any(NATIVE in d for d in node_details(compiled).values())
    assert_bitwise(results[1], results[0], "warm against cold")


@pytest.mark.parametrize(
    "side,cin,cout", [(40, 96, 144), (14, 96, 144), (7, 96, 144), (1, 960, 240)]
)
def test_two_threads_match_one(side: int, cin: int, cout: int) -> None:
    """A call split over threads (tiles of pixels, as many per thread: 1600 pixels in 18 tiles,
    196 in 4, 49 in 2; a 1x1 map by blocks of output channels) gives each output the same sum
    as one thread: every output is one thread's."""
    torch.manual_seed(19)
    model = Projection(cin, cout, "relu6", residual=False).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(20)
    x = torch.randn(1, cin, side, side, generator=gen)
    r = torch.randn(1, cout, side, side, generator=gen)
    threads = torch.get_num_threads()
    with torch.no_grad():
        try:
            torch.set_num_threads(1)
            one = compiled(x, r)
            torch.set_num_threads(2)
            two = compiled(x, r)
        finally:
            torch.set_num_threads(threads)
        torch.testing.assert_close(one, model(x, r), **contract_tol("conv", torch.float32))
    assert_bitwise(two, one, "two threads against one")


class Chain(nn.Module):
    """Three 1x1 convolutions in a row: the two results the program does not return live in
    the arena (each call writes into its buffer); the returned one is the call's own."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, o, 1) for c, o in ((24, 40), (40, 24), (24, 32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu6(conv(x))
        return x


def test_results_in_the_arena_match_eager_call_after_call() -> None:
    torch.manual_seed(21)
    model = Chain().eval()
    compiled = _check(model, [(2, 24, 9, 9)], seed=22, calls=4)
    program = compiled.specializations[-1].compiled.program
    homes = [
        program.memory_plan.by_value[step.outputs[0]].home
        for step in program.plan.steps
        if getattr(step, "call", None) is not None and NATIVE in step.call.detail
    ]
    assert homes == ["arena", "arena", "torch"], homes
    first = compiled(torch.randn(2, 24, 9, 9))
    kept = first.clone()
    compiled(torch.randn(2, 24, 9, 9))  # NOTE: a later call leaves a returned result as it was
    assert_bitwise(first, kept, "a returned result after another call")


def test_a_plan_of_contiguous_results_copies_each_native_result() -> None:
    """Without inferred layouts the plan expects contiguous results: a native call's
    channels_last result is then conformed (copied), never read as if contiguous, and gets no
    arena buffer."""
    torch.manual_seed(23)
    model = Chain().eval()
    compiled = plait.compile(model, backend="stax", options={"stax": {"infer_layouts": False}})
    gen = torch.Generator().manual_seed(24)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 24, 9, 9, generator=gen)
            torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    program = compiled.specializations[-1].compiled.program
    natives = [
        s for s in program.plan.steps if NATIVE in getattr(getattr(s, "call", None), "detail", "")
    ]
    assert len(natives) == 3
    assert all(program.memory_plan.by_value[s.outputs[0]].home == "torch" for s in natives)

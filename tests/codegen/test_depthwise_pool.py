"""A squeeze-and-excitation block's pool folded into the depthwise call before it.

EfficientNet's blocks average the depthwise convolution's (SiLU'd) result over its pixels
(``adaptive_avg_pool2d`` to 1x1) right after the call wrote it. The native depthwise call now
writes those means too (each output row's sums as it is stored, then the rows in order), and
the pool's step hands them over: the map is not read again. Where the call ran eager's ops (a
weight with a non-finite value), the pool's step pools the map as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from tests.codegen.native_conv_helpers import node_details, special_values
from tests.codegen.test_special_values import assert_matches_eager
from tests.util import assert_bitwise, contract_tol, torch_threads

POOLED = "global average pool written by node"


class SqueezeExcite(nn.Module):
    """EfficientNet's depthwise convolution, SiLU, then squeeze-and-excitation (squeezed by
    ``adaptive_avg_pool2d`` as torchvision's and Hugging Face's, or by ``mean`` as timm's);
    with ``both``, the pooled means are returned beside the block's result."""

    def __init__(self, c: int, k: int, s: int, both: bool = False, mean: bool = False) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, k, s, k // 2, groups=c)
        self.reduce = nn.Conv2d(c, max(c // 4, 1), 1)
        self.expand = nn.Conv2d(max(c // 4, 1), c, 1)
        self.both, self.mean = both, mean

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = F.silu(self.dw(x))
        s = h.mean((2, 3), keepdim=True) if self.mean else F.adaptive_avg_pool2d(h, 1)
        y = h * torch.sigmoid(self.expand(F.silu(self.reduce(s))))
        return (y, s) if self.both else y


def _compiled(model: nn.Module) -> object:
    model.eval()
    return plait.compile(model, backend="stax", options={"cache": False})


def _three_calls_match_eager(
    compiled: object, model: nn.Module, shape: tuple[int, ...], seed: int
) -> None:
    """Three calls on fresh draws, each against eager within the contract."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(shape, generator=gen)
            got = compiled(x)  # type: ignore[operator]
            torch.testing.assert_close(got, model(x), **contract_tol("conv", torch.float32))


def _pool_detail(compiled: object) -> str:
    details = node_details(compiled).items()
    (pool,) = [d for key, d in details if key.startswith(("adaptive", "mean"))]
    return pool


@pytest.mark.parametrize("mean", [False, True], ids=["adaptive_avg_pool2d", "mean"])
@pytest.mark.parametrize(
    "c,side,k,s,batch",
    [(32, 28, 3, 1, 1), (96, 29, 3, 2, 1), (240, 14, 5, 1, 2), (40, 9, 5, 2, 3), (20, 7, 3, 1, 1)],
)
def test_folded_pool_matches_eager(
    c: int, side: int, k: int, s: int, batch: int, mean: bool
) -> None:
    torch.manual_seed(c + side)
    model = SqueezeExcite(c, k, s, both=True, mean=mean)
    compiled = _compiled(model)
    gen = torch.Generator().manual_seed(side)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(batch, c, side, side, generator=gen) * 2
            got, want = compiled(x), model(x)
            torch.testing.assert_close(got[0], want[0], **contract_tol("conv", torch.float32))
            torch.testing.assert_close(got[1], want[1], **contract_tol("conv", torch.float32))
    assert _pool_detail(compiled).startswith(POOLED), _pool_detail(compiled)


def test_nan_and_infinities_reach_the_means_as_in_eager() -> None:
    torch.manual_seed(5)
    model = SqueezeExcite(48, 3, 1, both=True)
    compiled = _compiled(model)
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for _ in range(3):
            x = special_values((2, 48, 9, 11), gen)
            want = model(x)
            assert_matches_eager([*compiled(x)], [[*want]], "conv", "dw-silu-pool")
    assert _pool_detail(compiled).startswith(POOLED)


@pytest.mark.parametrize("mean", [False, True], ids=["adaptive_avg_pool2d", "mean"])
def test_a_non_finite_weight_pools_the_map_eager_computed(mean: bool) -> None:
    """The weight turned infinite between calls: the depthwise call runs eager's ops, and the
    pool's step pools that map (not the means of the call before)."""
    torch.manual_seed(7)
    model = SqueezeExcite(32, 3, 1, both=True, mean=mean)
    compiled = _compiled(model)
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        x = torch.randn(1, 32, 10, 10, generator=gen)
        compiled(x)
        model.dw.weight[3, 0, 1, 1] = float("inf")
        for _ in range(2):
            x = torch.randn(1, 32, 10, 10, generator=gen)
            want = model(x)
            assert_matches_eager([*compiled(x)], [[*want]], "conv", "inf weight")
        model.dw.weight[3, 0, 1, 1] = 0.5
        x = torch.randn(1, 32, 10, 10, generator=gen)
        want = model(x)
        assert_matches_eager([*compiled(x)], [[*want]], "conv", "finite again")


def test_two_threads_give_the_means_of_one() -> None:
    """Rows are split over threads; each image's rows are summed in order after them."""
    torch.manual_seed(9)
    model = SqueezeExcite(144, 3, 1, both=True)
    compiled = _compiled(model)
    x = torch.randn(1, 144, 56, 56, generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        with torch_threads(1):
            one = compiled(x)
        with torch_threads(2):
            two = compiled(x)
    assert_bitwise(two[1], one[1], "means, two threads against one")
    assert_bitwise(two[0], one[0], "block, two threads against one")


def test_pool_of_another_map_is_not_folded() -> None:
    """A pool of the depthwise call's input (not its result) stays ATen's."""

    class PoolOfInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dw = nn.Conv2d(16, 16, 3, 1, 1, groups=16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.silu(self.dw(x)) * F.adaptive_avg_pool2d(x, 1)

    torch.manual_seed(11)
    model = PoolOfInput()
    compiled = _compiled(model)
    with torch.no_grad():
        x = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(12))
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("conv", torch.float32))
    assert not _pool_detail(compiled).startswith(POOLED)


def _pooled_means(compiled: object) -> list[object]:
    """The pooled-means records of the compiled program's depthwise calls."""
    from plait.codegen.depthwise_conv import PooledMeans

    program = compiled.specializations[0].compiled.program  # type: ignore[attr-defined]
    found = []
    for step in program.plan.steps:
        fn = getattr(getattr(step, "call", None), "fn", None)
        for cell in getattr(fn, "__closure__", None) or ():
            if isinstance(cell.cell_contents, PooledMeans):
                found.append(cell.cell_contents)
    return list({id(p): p for p in found}.values())  # NOTE: the depthwise and pool steps share it


def test_means_read_by_one_convolution_are_written_in_one_kept_tensor() -> None:
    """The squeeze's means feed only the reduce convolution: every call writes them in the
    same tensor, and every call's block still matches eager on its own input."""
    torch.manual_seed(13)
    model = SqueezeExcite(64, 3, 1)
    compiled = _compiled(model)
    _three_calls_match_eager(compiled, model, (2, 64, 12, 12), 14)
    (pooled,) = _pooled_means(compiled)
    assert pooled.kept is not None  # type: ignore[attr-defined]
    assert _pool_detail(compiled).startswith(POOLED)


def test_means_returned_to_the_caller_are_a_new_tensor_each_call() -> None:
    """The means are a program output: a later call must not write into the tensor an
    earlier call returned."""
    torch.manual_seed(15)
    model = SqueezeExcite(48, 3, 1, both=True)
    compiled = _compiled(model)
    gen = torch.Generator().manual_seed(16)
    with torch.no_grad():
        first_x = torch.randn(1, 48, 10, 10, generator=gen)
        first = compiled(first_x)[1]
        kept = first.clone()
        second = compiled(torch.randn(1, 48, 10, 10, generator=gen))[1]
    assert first.data_ptr() != second.data_ptr()
    assert_bitwise(first, kept, "the first call's means after the second call")
    (pooled,) = _pooled_means(compiled)
    assert pooled.kept is None  # type: ignore[attr-defined]


def test_kept_means_are_float32_under_a_float64_default_dtype() -> None:
    """Compiled while the default dtype is float64, the block still computes in float32."""
    torch.manual_seed(17)
    model = SqueezeExcite(32, 3, 1)
    compiled = _compiled(model)
    x = torch.randn(1, 32, 8, 8, generator=torch.Generator().manual_seed(18))
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            got = compiled(x)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(got, want, **contract_tol("conv", torch.float32))
    (pooled,) = _pooled_means(compiled)
    assert pooled.kept is not None and pooled.kept.dtype == torch.float32  # type: ignore[attr-defined]


def test_a_depthwise_call_refused_at_its_dry_run_leaves_the_pool_to_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The depthwise call's dry run raised: its step runs eager's ops, which write no means
    (nor the kept tensor), and the pool step pools the map they wrote."""
    from dataclasses import replace

    from plait.codegen import native_conv_plan

    built = native_conv_plan.depthwise_call

    def refused(*args: object, **kwargs: object) -> object:
        def raises(*a: object, **k: object) -> object:
            raise RuntimeError("refused at the dry run")

        return replace(built(*args, **kwargs), fn=raises)  # type: ignore[arg-type]

    monkeypatch.setattr(native_conv_plan, "depthwise_call", refused)
    torch.manual_seed(19)
    model = SqueezeExcite(32, 3, 1)
    compiled = _compiled(model)
    _three_calls_match_eager(compiled, model, (1, 32, 10, 10), 20)
    assert "refused at the dry run" in str(node_details(compiled))

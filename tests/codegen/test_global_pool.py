"""A classifier's global average pool (``adaptive_avg_pool2d`` to 1x1) through plait's native
kernel, against eager on fresh draws: channels_last maps a convolution wrote, NCHW maps the
caller passed, several images, NaN and infinities; other pools and other dtypes stay ATen's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from tests.codegen.native_conv_helpers import node_details, special_values
from tests.codegen.test_special_values import assert_matches_eager
from tests.util import assert_bitwise, contract_tol, torch_threads

NATIVE = "native global average pool"


class Head(nn.Module):
    """A convolution, then a classifier's head; the pooled map is returned beside the logits."""

    def __init__(self, cin: int, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, c, 3, padding=1)
        self.fc = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = F.adaptive_avg_pool2d(F.relu(self.conv(x)), 1)
        return pooled, self.fc(pooled.flatten(1))


def _compiled(model: nn.Module, **stax: object) -> object:
    model.eval()
    options: dict[str, object] = {"cache": False}
    if stax:
        options["stax"] = stax
    return plait.compile(model, backend="stax", options=options)


def _pool_detail(compiled: object) -> str:
    (detail,) = [d for key, d in node_details(compiled).items() if key.startswith("adaptive")]
    return detail


@pytest.mark.parametrize("batch,cin,c,side", [(1, 16, 64, 7), (2, 8, 40, 9), (3, 4, 20, 1)])
def test_pool_of_a_convolutions_map_matches_eager(batch: int, cin: int, c: int, side: int) -> None:
    torch.manual_seed(c)
    model = Head(cin, c)
    compiled = _compiled(model)
    gen = torch.Generator().manual_seed(side)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(batch, cin, side, side, generator=gen) * 2
            (pooled, logits), (want_pooled, want_logits) = compiled(x), model(x)
            torch.testing.assert_close(pooled, want_pooled, **contract_tol("reduction", x.dtype))
            torch.testing.assert_close(logits, want_logits, **contract_tol("model", x.dtype))
    assert _pool_detail(compiled).startswith(NATIVE), _pool_detail(compiled)


def test_pool_of_the_callers_nchw_map_matches_eager() -> None:
    def pool(x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, (1, 1))

    compiled = plait.compile(pool, backend="stax", options={"cache": False})
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(2, 24, 5, 6, generator=gen)
        got, want = compiled(x), pool(x)
        torch.testing.assert_close(got, want, **contract_tol("reduction", x.dtype))
        for fmt in (torch.contiguous_format, torch.channels_last):
            assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt)
    assert _pool_detail(compiled).startswith(NATIVE)


def test_nan_and_infinities_reach_the_means_as_in_eager() -> None:
    def pool(x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x * 2, 1)

    compiled = plait.compile(pool, backend="stax", options={"cache": False})
    gen = torch.Generator().manual_seed(4)
    for _ in range(3):
        x = special_values((2, 32, 4, 5), gen).contiguous(memory_format=torch.channels_last)
        assert_matches_eager([compiled(x)], [[pool(x)]], "reduction", "global pool")
    assert _pool_detail(compiled).startswith(NATIVE)


def test_the_option_off_and_other_pools_stay_atens() -> None:
    torch.manual_seed(5)
    off = _compiled(Head(4, 16), global_pool=False)
    x = torch.randn(1, 4, 6, 6, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        off(x)
    assert _pool_detail(off) == "aten.adaptive_avg_pool2d (reduction)", _pool_detail(off)

    def two_by_two(x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, 2)

    def double(x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x.double(), 1)

    for fn in (two_by_two, double):
        compiled = plait.compile(fn, backend="stax", options={"cache": False})
        got = compiled(x)
        torch.testing.assert_close(got, fn(x), **contract_tol("reduction", got.dtype))
        assert not _pool_detail(compiled).startswith(NATIVE), fn.__name__


def test_two_threads_give_the_means_of_one() -> None:
    """A batch's map is split over threads by images and blocks of channels; each mean is one
    thread's sum in pixel order."""

    def pool(x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(x, 1)

    compiled = plait.compile(pool, backend="stax", options={"cache": False})
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 200, 17, 17, generator=gen).contiguous(memory_format=torch.channels_last)
    with torch_threads(1):
        one = compiled(x)
    with torch_threads(2):
        two = compiled(x)
    assert_bitwise(two, one, "two threads against one")
    torch.testing.assert_close(one, pool(x), **contract_tol("reduction", x.dtype))
    assert _pool_detail(compiled).startswith(NATIVE)

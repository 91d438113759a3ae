"""The planner's dry runs feed each extern placeholder operands; an integer result of an extern
(``topk``'s indices) may be the index of a later extern (``index_select``), so its placeholder
must be in range whatever the extern returned on zeros. ``topk`` of zeros returns indices past
the first ones (``[3, 5]`` of six), out of range for a four-row table: the compile must not
refuse a program eager runs, and an index out of range on a call must still raise."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise


def _topk_rows(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y.index_select(0, x.topk(2).indices) + 1


def _sorted_rows(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y[x.argsort(descending=True)[:2]] * 2


@pytest.mark.parametrize("fn", [_topk_rows, _sorted_rows])
def test_extern_index_result_feeds_an_index_extern(fn: object) -> None:
    compiled = plait.compile(fn)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        # NOTE: the two largest lie in the four rows of the table
        x = torch.cat([torch.randn(4, generator=g), torch.full((2,), -100.0)])
        y = torch.randn(4, 3, generator=g)
        assert_bitwise(compiled(x, y), fn(x, y), f"seed {seed}")  # type: ignore[operator]


def test_extern_index_result_out_of_range_still_raises() -> None:
    compiled = plait.compile(_topk_rows)
    x, y = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0]), torch.randn(4, 3)
    assert_bitwise(compiled(x, y), _topk_rows(x, y))
    bad = torch.tensor([0.0, 0.0, 0.0, 0.0, 5.0, 4.0])
    with pytest.raises(IndexError, match="index out of range"):
        _topk_rows(bad, y)
    with pytest.raises(IndexError, match="index out of range"):
        compiled(bad, y)

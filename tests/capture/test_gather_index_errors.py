"""``torch.gather`` with an index out of range raises eager's error class (``RuntimeError``)
naming the op, the dim and its size, on a static capture and on automatic dynamic's symbolic
one; in-range calls stay bitwise eager's. ``take_along_dim`` (a gather) raises
the same where eager's kernel, which checks nothing on CPU, reads past the row."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import assert_bitwise


def _gather(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.gather(x, 1, i) * 2


def _take_along(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    return torch.take_along_dim(x, i, 1) + 1


def _index(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 5, (rows, cols), generator=g)


def test_gather_index_out_of_range_raises_runtime_error_naming_gather() -> None:
    # NOTE: the third call's rows make the batch dim symbolic (automatic dynamic)
    compiled = plait.compile(_gather)
    g = torch.Generator().manual_seed(0)
    for rows in (3, 3, 4):
        x, i = torch.randn(rows, 5, generator=g), _index(rows, 2, g)
        assert_bitwise(compiled(x, i), _gather(x, i), f"{rows} rows")
        for bad in (5, -1, 2**40):
            j = i.clone()
            j[rows - 1, 1] = bad
            with pytest.raises(RuntimeError, match="out of bounds"):
                _gather(x, j)
            with pytest.raises(RuntimeError, match=r"gather\(\).*dimension 1 with size 5"):
                compiled(x, j)


def test_take_along_dim_index_out_of_range_raises() -> None:
    compiled = plait.compile(_take_along)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x, i = torch.randn(3, 5, generator=g), _index(3, 2, g)
        i[0, 0] = -5  # NOTE: in range: take_along_dim counts a negative index from the end
        assert_bitwise(compiled(x, i), _take_along(x, i))
        for bad in (5, -6):
            j = i.clone()
            j[2, 1] = bad
            with pytest.raises(RuntimeError, match=r"take_along_dim\(\).*dimension 1 with size 5"):
                compiled(x, j)


def test_gather_index_wider_than_the_source_raises_on_a_symbolic_capture() -> None:
    """An index dim other than ``dim`` may not exceed the source's (eager: "Size does not
    match"); once automatic dynamic made the index's dims symbolic, a wider index must not
    read on into the source's next row."""
    compiled = plait.compile(lambda x, i: torch.gather(x, 0, i) * 2)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, generator=g)
    for cols in (4, 5, 3):
        i = torch.randint(0, 3, (2, cols), generator=g)
        assert_bitwise(compiled(x, i), torch.gather(x, 0, i) * 2, f"{cols} columns")
    wide = torch.zeros(2, 7, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="Size does not match"):
        torch.gather(x, 0, wide)
    with pytest.raises(RuntimeError, match="Size does not match"):
        compiled(x, wide)

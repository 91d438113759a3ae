"""A symbolic size used as the fill value of a bool or integer tensor (``torch.full``,
``full_like``, ``fill_``, ``masked_fill``, a boolean-mask write, ``F.pad``'s value) converts as
eager converts the int at each call: a bool fill of ``n - 2`` is False at n = 2 (the capture used
to take ``bool`` of the size expression, always True, and served True at every size), and an
integer fill of a size expression is compiled instead of failing capture."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise

SIZES = (5, 2, 7, 3, 2, 9)


def _rows(n: int) -> torch.Tensor:
    return torch.randn(3, n)


def _mask_write(x: torch.Tensor) -> torch.Tensor:
    y = x > 1
    y[x > 0] = x.shape[1] - 2
    return y


CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "full_bool": lambda x: torch.full((3, x.shape[1]), x.shape[1] - 2, dtype=torch.bool) & (x > 0),
    "fill_bool": lambda x: (x > 0).fill_(x.shape[1] - 2),
    "new_full_bool": lambda x: (x > 0).new_full((2,), x.shape[1] - 2),
    "masked_fill_bool": lambda x: (x > 1).masked_fill(x > 0, x.shape[1] - 2),
    "mask_write_bool": _mask_write,
    "pad_bool": lambda x: F.pad(x > 0, (1, 1), value=x.shape[1] - 2),
    "full_int": lambda x: torch.full((3, x.shape[1]), x.shape[1], dtype=torch.int64) * (x > 0),
    "full_like_int": lambda x: torch.full_like(x.long(), x.shape[1] - 3),
    "masked_fill_int": lambda x: (x * 10).long().masked_fill(x > 0, x.shape[1] - 3),
    "fill_int": lambda x: (x * 10).int().fill_(x.shape[1] - 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_symbolic_size_fill_values_match_eager(name: str) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    for seed, n in enumerate(SIZES):
        torch.manual_seed(seed)
        x = _rows(n)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CaptureFallbackWarning)
            got = compiled(x)
        assert_bitwise(got, fn(x), f"{name} at n={n}")
    assert all(s.fallback_reason is None for s in compiled.specializations)

"""Reflect and circular padding of a symbolic dim (``dynamic=True``, or automatic dynamic's
second capture) hold only while the dim is large enough: eager refuses a reflect pad not less
than the size and a circular pad that wraps more than once. The capture guards those sizes, so
a later call at a size eager refuses raises eager's error, never returns values read past the
input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import assert_bitwise


def _reflect(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, (2, 3), mode="reflect") * 2


def _circular(x: torch.Tensor) -> torch.Tensor:
    # NOTE: no crop: with one, a pad past the cropped size makes eager copy from its own
    # unwritten result (no error: undefined values), so no call there compares
    return F.pad(x, (3, 0), mode="circular") + 1


def _replicate(x: torch.Tensor) -> torch.Tensor:
    return F.pad(x, (-2, -2), mode="replicate") + 1


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn", [_reflect, _circular, _replicate])
def test_pad_of_a_symbolic_dim_too_small_raises_as_eager(fn: object, dynamic: bool) -> None:
    compiled = plait.compile(fn, dynamic=dynamic)
    g = torch.Generator().manual_seed(0)
    for n in (9, 7, 6, 4, 3, 2, 1, 8):
        x = torch.randn(1, 3, n, generator=g)
        try:
            want = fn(x)  # type: ignore[operator]
        except RuntimeError:
            with pytest.raises(RuntimeError):
                compiled(x)
            continue
        assert_bitwise(compiled(x), want, f"size {n}")

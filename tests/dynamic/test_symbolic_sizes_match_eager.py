"""Symbolic programs answer as eager at every size they accept: floor division and modulo of
size expressions that go negative (Python's floor semantics, not C's truncation), interpolation
by a non-integer scale factor (PyTorch indexes with the given scale, not the size ratio), and
pooling whose ceil mode drops or keeps a last window depending on the size."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

SIZES = (8, 17, 2, 3, 33, 5, 13)
TOL = contract_tol("model", torch.float32)


def _judge(fn: Callable[[torch.Tensor], torch.Tensor], make: Callable[[int], torch.Tensor]) -> None:
    compiled = plait.compile(fn, dynamic=True, options={"cache": False, "recompile_limit": 20})
    for seed, n in enumerate(SIZES):
        torch.manual_seed(seed)
        x = make(n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(x)
        torch.testing.assert_close(got, fn(x), rtol=TOL["rtol"], atol=TOL["atol"])


def _rows(n: int) -> torch.Tensor:
    return torch.randn(3, n)


def _image(n: int) -> torch.Tensor:
    return torch.randn(1, 2, n + 1, n + 2)


def _large_image(n: int) -> torch.Tensor:  # NOTE: a 0.3 scale of each side is at least 1
    return torch.randn(1, 2, n + 4, n + 7)


CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[int], torch.Tensor]]] = {
    "floordiv_negative": (lambda x: x * ((x.shape[1] - 5) // 2), _rows),
    "mod_negative": (lambda x: x * ((x.shape[1] - 5) % 3), _rows),
    "mod_negative_divisor": (lambda x: x * (x.shape[1] % -3), _rows),
    "ceil_division": (lambda x: x * (-(-x.shape[1] // 4)), _rows),
    "full_like_negative": (lambda x: torch.full_like(x, (x.shape[1] - 7) // 3) + x, _rows),
    "compare_negative": (lambda x: (x * 10 > (x.shape[1] - 9) // 2).float(), _rows),
    "nearest_1_5": (lambda x: F.interpolate(x, scale_factor=1.5, mode="nearest"), _image),
    "bilinear_0_3": (lambda x: F.interpolate(x, scale_factor=0.3, mode="bilinear"), _large_image),
    "bilinear_1_7": (lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear"), _image),
    "max_pool_ceil": (lambda x: F.max_pool2d(x, 3, 3, 0, ceil_mode=True), _image),
    "avg_pool_ceil": (lambda x: F.avg_pool2d(x, 3, 3, 1, ceil_mode=True), _image),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_symbolic_sizes_match_eager(name: str) -> None:
    _judge(*CASES[name])

"""A Python int beside a float32 tensor is rounded to float32 once, as ATen converts it.

Eager wraps the int as an int64 0-dim tensor and converts it to float32 directly (nearest, ties
to even). The kernels converted it to a Python float (float64) first, and the float32 literal
rounded it again: ``2**60 + 2**36 + 1`` is ``2**60 + 2**36`` in float64, a tie that float32
breaks to ``2**60``, where eager's single rounding gives ``2**60 + 2**37``. Comparisons with
such a number flipped and a sum that cancels it was off by its whole ulp. The same held for
the Scalar arguments capture turned into floats (threshold's, hardtanh's bounds) and for
``add``'s alpha. ``F.pad``'s value is the exception: a ``float?`` in its schema, eager rounds an
int to float64 first (an int64 tensor padded with ``2**60 + 1`` gets ``2**60``), where
``constant_pad_nd`` takes a Scalar. Only ints past float64's 53 bits round twice; results must
equal eager's bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.codegen.kir import int_to_f32
from tests.util import assert_bitwise

BIG = 2**60 + 2**36 + 1  # NOTE: above the float32 midpoint; float64 rounds it onto the midpoint
NEG = -(2**62 + 2**38 + 3)

CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "lt": lambda x: x < BIG,
    "eq": lambda x: x == BIG,
    "add_cancel": lambda x: x + BIG - 2.0**60,
    "mul": lambda x: x * BIG,
    "div": lambda x: x / BIG,
    "where": lambda x: torch.where(x > 2.0**60, x, BIG),
    "clamp": lambda x: x.clamp(max=BIG),
    "negative": lambda x: (x * -4 > NEG) | (x - NEG == 0),
    "threshold": lambda x: F.threshold(x, BIG, NEG),
    "hardtanh": lambda x: F.hardtanh(x, -BIG, BIG),
    "add_alpha": lambda x: torch.add(x, torch.ones_like(x), alpha=BIG) - x,
    "pad": lambda x: F.pad(x, (1, 2), value=BIG) - 2.0**60,
    "constant_pad_nd": lambda x: torch.constant_pad_nd(x, (1, 2), BIG) - 2.0**60,
    "pad_int64": lambda x: F.pad(x.long(), (1, 2), value=2**60 + 1) - 2**60,
    "constant_pad_nd_int64": lambda x: torch.constant_pad_nd(x.long(), (1, 2), 2**60 + 1),
}


def _draw(seed: int) -> torch.Tensor:
    """float32 values at and around the two ints' float32 neighbours, and ordinary ones."""
    gen = torch.Generator().manual_seed(seed)
    steps = torch.randint(-3, 4, (64,), generator=gen).double()
    near = (2.0**60 + steps * 2.0**37).float()
    return torch.cat([near, torch.randn(64, generator=gen)])[torch.randperm(128, generator=gen)]


def test_the_conversion_rounds_once() -> None:
    for value in (BIG, NEG, 2**24 + 1, 2**53 + 1, -(2**63), 7):
        assert int_to_f32(value) == torch.tensor(value).float().item(), value


@pytest.mark.parametrize("name", sorted(CASES))
def test_int_literal_matches_eager(name: str) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, backend="stax", options={"cache": False})
    for seed in range(3):
        x = _draw(seed)
        assert_bitwise(compiled(x), fn(x), f"{name} draw {seed}")

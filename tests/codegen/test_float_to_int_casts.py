"""Float to integer casts in Stax's C++ kernels give eager's integers for every float.

PyTorch's CPU casts (``c10::convert``) take int8, int16 and int32 through a 32-bit conversion and
uint8 and int64 through a 64-bit one; NaN, infinities and values out of the wide type's range give
what the machine's conversion instruction gives (on x86 the lowest integer, so an int16 of 3e10 is
0). Eager agrees with itself on this across its scalar, vector and strided loops. The kernels took
int8 and int16 through 64 bits (an int16 of 3e10 was -20480) and cast with a bare C++ cast, which
the compiler may fold as it likes where the value is known to be NaN (a bfloat16 NaN, rounded by
the kernel, became int32 0 where eager gives the lowest integer). Integers are exact under the
contract: the comparison is ``torch.equal``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait

INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
SOURCES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _values(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Values of every magnitude (both signs, up to 1e30, past int64's range) with NaN and
    infinities among them, enough of them to run the kernels' vector loops."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.rand(256, generator=gen, dtype=torch.float64) * 30)
    sign = torch.where(torch.rand(256, generator=gen) < 0.5, -1.0, 1.0).double()
    x = magnitude * sign + torch.rand(256, generator=gen, dtype=torch.float64)
    x[torch.randperm(256, generator=gen)[:24]] = torch.tensor(
        [float("nan"), float("inf"), float("-inf")], dtype=torch.float64
    ).repeat(8)
    return x.to(dtype)


def _check(
    fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype, backend: str = "stax"
) -> Any:
    """``fn`` compiled for ``backend`` equals eager on three draws; returns the compiled."""
    compiled = plait.compile(fn, backend=backend)
    with torch.no_grad():
        for seed in range(3):
            x = _values(seed, dtype)
            expected, got = fn(x), compiled(x.clone())
            assert expected.dtype == got.dtype
            bad = (expected != got).nonzero().flatten()
            assert bad.numel() == 0, [
                (x[i].item(), expected[i].item(), got[i].item()) for i in bad[:4]
            ]
    return compiled


@pytest.mark.parametrize("source", SOURCES, ids=str)
@pytest.mark.parametrize("target", INTS, ids=str)
def test_cast_of_input_matches_eager(source: torch.dtype, target: torch.dtype) -> None:
    _check(lambda x: (x * 1).to(target), source)


@pytest.mark.parametrize("target", INTS, ids=str)
def test_cast_after_bfloat16_rounding_matches_eager(target: torch.dtype) -> None:
    # NOTE: the kernel rounds to bfloat16 (NaN becomes a constant) and casts the rounded value
    _check(lambda x: x.to(torch.bfloat16).to(target), torch.float32)

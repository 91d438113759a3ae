"""clamp (and hardtanh, which is a clamp) by a Python bound too small for a 16-bit dtype.

ATen converts a scalar bound to the tensor's dtype before its loop: in float16 a bound of
1e-40 is +0.0, so ``clamp(-0.0, min=1e-40)`` is -0.0 (``-0.0 < +0.0`` is false), and
``clamp(+0.0, max=-1e-40)`` is +0.0. Compared in float32 with the bound as given, the kernel
took the bound and rounded it: a zero of the other sign.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import assert_bitwise

CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "clamp_min": lambda x: torch.clamp(x * 1, min=1e-40),
    "clamp_max": lambda x: torch.clamp(x * 1, max=-1e-40),
    "clamp_both": lambda x: torch.clamp(x * 1, 1e-40, 1.0),
    "hardtanh": lambda x: F.hardtanh(x * 1, -1.0, -1e-40),
}


def _draw(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random values with zeros of both signs, NaN and infinities at random positions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, generator=g).to(dtype)
    specials = (0.0, -0.0, 0.0, -0.0, float("nan"), float("inf"), float("-inf"))
    for k, i in enumerate(torch.randperm(128, generator=g)[:28].tolist()):
        x[i] = specials[k % len(specials)]
    return x


def check_clamp(name: str, dtype: torch.dtype, options: dict[str, Any]) -> None:
    """The compiled ``CASES[name]`` against eager on three draws: NaN by position (eager's
    bfloat16 vector loop writes NaN as 0xffff, its scalar loop as 0x7fc0), every other element
    by its bits, the sign of a zero included."""
    fn = CASES[name]
    compiled = plait.compile(fn, backend="stax", options={"cache": False, **options})
    for seed in range(3):
        x = _draw(dtype, seed)
        with torch.no_grad():
            got, expected = compiled(x), fn(x)
        nan = expected.isnan()
        assert torch.equal(got.isnan(), nan), f"{name} {dtype} seed {seed}: NaN positions"
        assert_bitwise(got[~nan], expected[~nan], f"{name} {dtype} seed {seed}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", sorted(CASES))
def test_bound_converted_to_the_dtype(name: str, dtype: torch.dtype) -> None:
    check_clamp(name, dtype, {})

"""``add`` and ``sub`` with ``alpha`` against eager on infinities and products that overflow.

ATen computes ``x + alpha * y`` as one fused multiply-add (``vec::fmadd`` in its vector loop;
its scalar loop is contracted to one too): the product is never rounded, so an infinite ``x``
with a finite ``y`` whose scaled value overflows gives ``x``. Computed as a product and then a
sum, ``inf + (-2 * 3e38)`` is ``inf - inf``, NaN: a NaN where eager has an infinity.

float32 and float64 only: for 16-bit dtypes eager's answer depends on the element's position
(its vector loop fuses in float32, its scalar tail rounds the product to 16 bits first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from tests.util import assert_bitwise, contract_tol

OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": lambda x, y: torch.add(x * 1, y, alpha=2),
    "sub": lambda x, y: torch.sub(x * 1, y, alpha=2),
    "add_negative_alpha": lambda x, y: torch.add(x * 1, y, alpha=-3),
    "sub_scalar_other": lambda x, y: torch.sub(x * 1, 0.75, alpha=3) + y * 0,
    # NOTE: a product that is not finite: the fused form's answer is the plain one's
    "add_nan_alpha": lambda x, y: torch.add(x * 1, y, alpha=float("nan")),
    "sub_inf_alpha": lambda x, y: torch.sub(x * 1, y, alpha=float("inf")),
    "sub_scalar_inf_alpha": lambda x, y: torch.sub(x * 1, 3.0, alpha=float("-inf")) + y * 0,
}


def _draw(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random operands with, at random positions, an infinite ``x`` beside a ``y`` whose
    scaled value overflows (either sign), and NaN, zeros of both signs and infinities in each."""
    g = torch.Generator().manual_seed(seed)
    n = 96
    x = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    big = torch.finfo(dtype).max / 1.5
    pos = torch.randperm(n, generator=g).tolist()
    inf = float("inf")
    for k, i in enumerate(pos[:16]):
        x[i] = inf if k % 2 else -inf
        y[i] = big if k % 4 < 2 else -big
    specials = (float("nan"), 0.0, -0.0, inf, -inf)
    for k, i in enumerate(pos[16:26]):
        x[i] = specials[k % len(specials)]
    for k, i in enumerate(pos[26:36]):
        y[i] = specials[k % len(specials)]
    return x, y


def check_scaled_add(name: str, dtype: torch.dtype, options: dict[str, Any]) -> None:
    """The compiled ``OPS[name]`` against eager on three draws: NaN and infinities at the same
    positions with the same bits, the finite values within the pointwise contract."""
    fn = OPS[name]
    compiled = plait.compile(fn, backend="stax", options={"cache": False, **options})
    for seed in range(3):
        x, y = _draw(dtype, seed)
        with torch.no_grad():
            expected, got = fn(x, y), compiled(x, y)
        finite = expected.isfinite()
        assert torch.equal(got.isfinite(), finite), f"{name} seed {seed}: non-finite positions"
        assert_bitwise(got[~finite], expected[~finite], f"{name} seed {seed}: NaN and infinities")
        torch.testing.assert_close(
            got[finite], expected[finite], **contract_tol("pointwise", dtype)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(OPS))
def test_scaled_add_keeps_eagers_infinities(name: str, dtype: torch.dtype) -> None:
    check_scaled_add(name, dtype, {})


def test_float32_scaled_add_rounds_once_as_eager() -> None:
    """float32: the product held exactly, the sum rounded once, bit for bit eager's fused
    multiply-add on random operands (alpha 0.3 is not a float32: read as ATen rounds it)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, generator=g), torch.randn(4096, generator=g)

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sub(x * 1, y, alpha=0.3)

    compiled = plait.compile(fn, options={"cache": False})
    with torch.no_grad():
        assert_bitwise(compiled(x, y), fn(x, y), "sub(alpha=0.3)")

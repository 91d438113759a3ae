"""``x ** e`` whose exponent the kernel reads as 0.5 without being exactly 0.5.

A float32 kernel reads a Python-float exponent at float32 (as eager's vector loop does), so
``x ** 0.5000000001`` is a power by 0.5f there. Eager's pow, not its sqrt, runs for such an
exponent: ``pow(-inf, e)`` is +inf and ``pow(-0, e)`` is +0, where sqrt gives NaN and -0. The
kernel must keep pow's answers at those values (GCC turns a vectorized pow by a constant 0.5
into sqrt unless it is written out), for every float dtype.

Eager itself reads the exponent as a double in the scalar loop that finishes a contiguous run
shorter than a vector (``docs/stax.md``); the inputs here are whole vectors of every width.
"""

from __future__ import annotations

import pytest
import torch

import plait
from tests.util import contract_tol

SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0)
# NOTE: each rounds to 0.5 at float32, bfloat16 and float16 and is not 0.5 itself
EXPONENTS = (0.5000000001, 0.4999999999)


def _draw(dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, generator=g) * 4
    where = torch.randperm(64, generator=g)[: 3 * len(SPECIALS)]
    x[where] = torch.tensor(SPECIALS).repeat(3)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("e", EXPONENTS)
def test_pow_by_an_exponent_read_as_half_keeps_pow_at_special_values(
    dtype: torch.dtype, e: float
) -> None:
    assert e != 0.5 and float(torch.tensor(e, dtype=torch.float64).to(dtype)) == 0.5
    f = lambda x: x**e
    compiled = plait.compile(f, fullgraph=True, options={"cache": False})
    for seed in (1, 2, 3):  # NOTE: fresh values on each call: a stale result shows
        x = _draw(dtype, seed)
        want, got = f(x), compiled(x)
        assert torch.equal(want.isnan(), got.isnan()), (x, want, got)
        exact = (want == 0) | want.isinf()
        assert torch.equal(want[exact], got[exact]), (x[exact], want[exact], got[exact])
        assert torch.equal(want[exact].signbit(), got[exact].signbit()), (x[exact], got[exact])
        finite = want.isfinite()
        torch.testing.assert_close(got[finite], want[finite], **contract_tol("pointwise", dtype))

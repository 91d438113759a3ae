"""Compiled Stax kernels against eager on fresh random inputs, for value cases the op-database
sweeps (``test_special_values``) do not reach.

Normalization of rows whose elements are all equal: eager's moments (Welford) give the row's
value as its mean exactly, so ``x - mean`` is 0 and layer_norm / group_norm return ``bias`` (NaN
with ``eps=0``: 0 * inf). A mean taken as ``sum / n`` is off by an ulp or two, and ``rstd``
(``1/sqrt(eps)``) magnifies that to about 1e-4, past the contract's tolerance; with ``eps=0`` the
output was +-1 instead of NaN.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import contract_tol


def _rows_of_one_value(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Random values, every (N, C, ...) row of the trailing dims equal to one random value; a
    few rows ordinary random values."""
    value = torch.randn(*shape[:2], *([1] * (len(shape) - 2)), generator=gen) * 10
    x = value.expand(*shape).contiguous()
    x[0, 0] = torch.randn(*shape[2:], generator=gen)
    return x


def _assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    tol = contract_tol("normalization", want.dtype)
    torch.testing.assert_close(
        got, want, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True, msg=lambda m: f"{what}: {m}"
    )


@pytest.mark.parametrize("eps", [1e-5, 0.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_layer_norm_of_equal_rows_matches_eager(seed: int, eps: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = _rows_of_one_value(gen, 3, 4, 5, 7)
    weight, bias = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)

    def fn(a: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(a * 1.0, (5, 7), weight, bias, eps=eps)

    with torch.no_grad():
        got = plait.compile(fn, backend="stax")(x.clone())
    _assert_close(got, fn(x.clone()), f"layer_norm eps={eps}")


@pytest.mark.parametrize("eps", [1e-5, 0.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_group_norm_of_equal_groups_matches_eager(seed: int, eps: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    # NOTE: every channel of a group holds one value: (N, G, 1, 1) expanded over the group
    value = torch.randn(3, 2, 1, 1, 1, generator=gen) * 10
    x = value.expand(3, 2, 3, 5, 7).reshape(3, 6, 5, 7).contiguous()
    x[0, :3] = torch.randn(3, 5, 7, generator=gen)

    def fn(a: torch.Tensor) -> torch.Tensor:
        # NOTE: without weight and bias: with them eager computes x * scale + (bias - scale *
        # mean), whose rounding of a large scale * mean is off by far more than the tolerance
        return F.group_norm(a * 1.0, 2, eps=eps)

    with torch.no_grad():
        got = plait.compile(fn, backend="stax")(x.clone())
    _assert_close(got, fn(x.clone()), f"group_norm eps={eps}")

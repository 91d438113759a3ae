"""A linear whose inner dim is 0 (a size-0 specialization of a dynamic dim: ``x[:, :k]`` at
``k = 0`` fed to a weight built from the shape) answers as eager, zeros plus the bias: oneDNN
creates no primitive for an empty dim, so such a node never runs through it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import contract_tol

TOL = contract_tol("matmul", torch.float32)


def _no_bias(x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, torch.ones(7, x.shape[1]))


def _bias(x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, torch.ones(7, x.shape[1]), torch.arange(7.0)).relu()


@pytest.mark.parametrize("fn", [_no_bias, _bias], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_a_linear_of_an_empty_inner_dim(
    fn: Callable[[torch.Tensor], torch.Tensor], dynamic: bool | None
) -> None:
    compiled = plait.compile(fn, dynamic=dynamic, options={"cache": False})
    for k in (4, 6, 0, 3):
        x = torch.randn(3, k)
        torch.testing.assert_close(compiled(x), fn(x), **TOL, msg=f"inner dim {k}")

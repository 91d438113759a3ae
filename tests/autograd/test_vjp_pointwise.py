"""Derivative rules of pointwise ops against PyTorch autograd and finite differences."""

from __future__ import annotations

import pytest

from plait.ir import Category, all_ops
from plait.ir.ops.vjp import is_differentiable
from tests.autograd.vjp_check import check_op

OPS = sorted(
    n for n, o in all_ops().items() if o.category is Category.POINTWISE and is_differentiable(n)
)


@pytest.mark.parametrize("op", OPS)
def test_pointwise_vjp(op: str) -> None:
    check_op(op)

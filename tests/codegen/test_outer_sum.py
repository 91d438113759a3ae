"""Sums over leading dims only (bias gradients) run through ATen; the rest stay native."""

from __future__ import annotations

import pytest
import torch

import plait.contract
from plait.ir import GraphBuilder, TensorType
from plait.runtime import compile_graph


def _program(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> object:
    b = GraphBuilder()
    x = b.input("x", TensorType(shape, torch.float32))
    b.output(b.call("sum", x, dims=dims, keepdim=keepdim))
    return compile_graph(b.build())


@pytest.mark.parametrize(
    ("shape", "dims", "keepdim", "executor"),
    [
        ((4, 32, 96), (0, 1), False, "extern"),  # NOTE: a bias gradient
        ((4, 32, 96), (0,), True, "extern"),
        ((4, 32, 96), (-3, -2), False, "extern"),
        ((4, 32, 8), (0, 1), False, "native"),  # NOTE: an inner block below the threshold
        ((4, 32, 96), (1,), False, "native"),  # NOTE: not a leading dim
        ((4, 32, 96), (0, 1, 2), False, "native"),  # NOTE: every dim: one row
    ],
)
def test_outer_sums_run_through_aten(
    shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool, executor: str
) -> None:
    program = _program(shape, dims, keepdim)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    (got,) = program(x)  # type: ignore[operator]
    tol = plait.contract.load().tolerance("reduction", "float32")
    torch.testing.assert_close(got, x.sum(dims, keepdim=keepdim), rtol=tol.rtol, atol=tol.atol)
    (node,) = program.records()["evidence"]["nodes"]  # type: ignore[attr-defined]
    assert node["executor"] == executor, node

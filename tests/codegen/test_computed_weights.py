"""A linear or convolution whose weight the program computes (a weight normalization, a merged
low-rank update) runs on that call's weight: oneDNN's reordered and MKL's packed copies of a
weight are reused only for a graph input or a constant, whose contents change only with its
version counter; a computed weight is rewritten in the same buffer at every call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.util import contract_tol


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w * 2, b)


def _linear_add(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w * 2) + b


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.conv2d(x, w * 2, b)


LINEAR = [(16, 64), (128, 64), (128,)]
ONEDNN = {"mkl_linear": False, "timed_matmul": False}
CASES: dict[str, tuple[Callable[..., torch.Tensor], list[tuple[int, ...]], str, dict[str, Any]]] = {
    "linear, MKL": (_linear, LINEAR, "matmul", {}),
    "linear, oneDNN": (_linear, LINEAR, "matmul", ONEDNN),
    "linear + add, oneDNN": (_linear_add, [(16, 64), (128, 64), (16, 128)], "matmul", ONEDNN),
    "conv2d, oneDNN": (_conv, [(2, 3, 10, 10), (8, 3, 3, 3), (8,)], "conv", {}),
}


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("case", list(CASES))
def test_a_weight_computed_by_the_program_is_prepared_at_every_call(case: str) -> None:
    fn, shapes, op_class, stax = CASES[case]
    compiled = plait.compile(fn, backend="stax", options={"stax": stax})
    tol = contract_tol(op_class, torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(3):
            args = [torch.randn(s, generator=gen) for s in shapes]
            torch.testing.assert_close(compiled(*args), fn(*args), **tol)


@pytest.mark.usefixtures("stax_cache")
def test_a_computed_weight_of_a_linear_of_symbolic_rows_is_packed_at_every_call() -> None:
    compiled = plait.compile(_linear, backend="stax", dynamic={"x": {0: "rows"}})
    tol = contract_tol("matmul", torch.float32)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for rows in [16, 16, 9, 16]:
            args = [torch.randn(s, generator=gen) for s in [(rows, 64), *LINEAR[1:]]]
            torch.testing.assert_close(compiled(*args), _linear(*args), **tol)

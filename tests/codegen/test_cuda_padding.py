"""16-bit CUDA matrix products with a dimension not a multiple of 8 run on zero-padded operands
(``plait.codegen.cuda_padding``): the arithmetic checked on the CPU in float32 and float64 for
every orientation and misaligned dimension, and which nodes take it. The CUDA run:
``tests/gpu/test_cuda_padded_products.py``."""

from __future__ import annotations

import pytest
import torch

from plait.codegen import cuda_padding
from plait.ir import GraphBuilder, TensorType
from plait.passes import product_alignment
from tests.util import contract_tol

MATMUL = contract_tol("matmul", torch.float32)
SHAPES = [(5, 3, 7), (16, 8, 8), (16, 13, 24), (9, 16, 8), (2, 50, 33)]


def _operand(gen: torch.Generator, rows: int, cols: int, transposed: bool) -> torch.Tensor:
    if transposed:
        return torch.randn(cols, rows, generator=gen).t()
    return torch.randn(rows, cols, generator=gen)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_padded_matmul_is_the_product(m: int, k: int, n: int, a_t: bool, b_t: bool) -> None:
    gen = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a, b = _operand(gen, m, k, a_t), _operand(gen, k, n, b_t)
    got = cuda_padding.padded_matmul(a, b)
    assert got.shape == (m, n)
    torch.testing.assert_close(got, a @ b, **MATMUL)
    a64, b64 = a.double(), b.double()
    torch.testing.assert_close(
        cuda_padding.padded_matmul(a64, b64), a64 @ b64, **contract_tol("matmul", torch.float64)
    )


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_padded_linear_and_batched_matmul(m: int, k: int, n: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(m + k + n)
    x = torch.randn(3, m, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    torch.testing.assert_close(
        cuda_padding.padded_linear(x, w, b), torch.nn.functional.linear(x, w, b), **MATMUL
    )
    torch.testing.assert_close(cuda_padding.padded_matmul(x, w.t()), x @ w.t(), **MATMUL)


def test_special_values_stay_where_they_were() -> None:
    """Padding multiplies zeros by zeros only: an inf or NaN reaches the outputs it reaches in
    the unpadded product and no other."""
    a = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    b = torch.randn(3, 7, generator=torch.Generator().manual_seed(2))
    a[1, 2], b[0, 4] = float("inf"), float("nan")
    want, got = a @ b, cuda_padding.padded_matmul(a, b)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))


def _node(op: str, x: tuple[int, ...], w: tuple[int, ...], dtype: torch.dtype, device: str):  # type: ignore[no-untyped-def]
    gb = GraphBuilder()
    xv = gb.input("x", TensorType(x, dtype, device))
    wv = gb.input("w", TensorType(w, dtype, device))
    gb.output(gb.call(op, xv, wv))
    return gb.build().nodes[0]


def test_which_products_are_padded() -> None:
    bf16 = torch.bfloat16
    assert product_alignment.misaligned(_node("linear", (4, 64), (50257, 64), bf16, "cuda:0"))
    assert product_alignment.misaligned(_node("matmul", (8, 50257), (50257, 64), bf16, "cuda:0"))
    assert product_alignment.misaligned(_node("matmul", (50257, 64), (64, 64), bf16, "cuda:0"))
    assert not product_alignment.misaligned(_node("linear", (4, 64), (128, 64), bf16, "cuda:0"))
    assert product_alignment.misaligned(_node("matmul", (4, 64), (64, 128), bf16, "cuda:0"))
    # NOTE: a batched operand's rows are never a leading dimension
    assert not product_alignment.misaligned(_node("matmul", (2, 7, 64), (64, 64), bf16, "cuda:0"))
    assert not product_alignment.misaligned(_node("linear", (4, 64), (50257, 64), bf16, "cpu"))
    assert not product_alignment.misaligned(
        _node("linear", (4, 64), (50257, 64), torch.float32, "cuda:0")
    )

"""A tensor argument that is not strided (sparse COO or CSR, nested): compiled programs take
strided tensors, so such a call runs eagerly with a warning, also after a strided call compiled
the program (its guards held for the sparse tensor's dtype and shape, and the program then read
its storage: NotImplementedError); a strided call after it runs the compiled program again."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol

NO_CACHE = {"cache": False}


def _product(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (s @ x).relu()


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_sparse_argument_runs_eagerly_with_a_warning(layout: str) -> None:
    compiled = plait.compile(_product, options=NO_CACHE)
    dense, x = torch.randn(5, 5), torch.randn(5, 3)
    want = _product(dense, x)
    torch.testing.assert_close(compiled(dense, x), want, **contract_tol("matmul", torch.float32))
    sparse = dense.to_sparse() if layout == "coo" else dense.to_sparse_csr()
    with pytest.warns(CaptureFallbackWarning, match=f"a sparse_{layout} tensor"):
        assert_bitwise(compiled(sparse, x), _product(sparse, x))
    torch.testing.assert_close(compiled(dense, x), want, **contract_tol("matmul", torch.float32))
    assert len(compiled.specializations) == 1

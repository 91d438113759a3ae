"""A result that is not a dense strided tensor (sparse, mkldnn) has no IR type: capture refuses
it by name (fullgraph) or falls back loudly, and the fallback returns eager's tensor; it never
reaches the Stax runner (which raised "unsupported memory format option Contiguous")."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError

CASES: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("to_sparse", lambda x: x.to_sparse()),
    ("to_sparse_csr", lambda x: (x * 2).to_sparse_csr()),
]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize(("name", "fn"), CASES, ids=[c[0] for c in CASES])
def test_sparse_result_falls_back_loudly(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    cf = plait.compile(fn, backend="stax")
    with pytest.warns(CaptureFallbackWarning, match="dense strided tensors only"):
        cf(torch.randn(3, 3))
    x = torch.randn(3, 3)
    got, want = cf(x), fn(x)
    assert got.layout == want.layout
    assert torch.equal(got.to_dense(), want.to_dense())
    assert "dense strided tensors only" in str(cf.specializations[-1].fallback_reason)


def test_sparse_result_refused_by_fullgraph() -> None:
    with pytest.raises(GraphCaptureError, match="to_sparse"):
        plait.compile(lambda x: (x + 1).to_sparse(), backend="stax", fullgraph=True)(
            torch.randn(3, 3)
        )

"""nn.Embedding's gradient options: ``scale_grad_by_freq`` divides each row's gradient by how
often its index occurs, ``sparse`` makes the gradient sparse. Neither changes the forward, so a
compiled training step must either compute eager's gradient or refuse loudly, never return the
plain dense gradient in their place."""

from __future__ import annotations

import warnings

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_bitwise


def _indices(gen: torch.Generator, rows: int) -> torch.Tensor:
    # NOTE: few rows, many draws: indices repeat, which is what scale_grad_by_freq weighs
    return torch.randint(0, rows, (3, 7), generator=gen)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_scale_grad_by_freq_gives_eager_gradient(padding_idx: int | None) -> None:
    gen = torch.Generator().manual_seed(11)
    model = torch.nn.Embedding(6, 5, padding_idx=padding_idx, scale_grad_by_freq=True)
    compiled = plait.compile(model, options={"cache": False})
    for draw in range(3):
        idx, weights = _indices(gen, 6), torch.randn(3, 7, 5, generator=gen)
        (compiled(idx) * weights).sum().backward()
        got, model.weight.grad = model.weight.grad, None
        (model(idx) * weights).sum().backward()
        want, model.weight.grad = model.weight.grad, None
        assert got is not None and want is not None
        assert_bitwise(got, want, f"draw {draw}")
    assert not plait.explain(compiled).specializations[0].manifest.fallbacks


def test_sparse_gradient_is_refused_loudly_under_training() -> None:
    gen = torch.Generator().manual_seed(12)
    model = torch.nn.Embedding(6, 5, sparse=True)
    idx = _indices(gen, 6)
    with pytest.raises(GraphCaptureError, match="sparse gradient"):
        plait.compile(model, fullgraph=True, options={"cache": False})(idx)
    compiled = plait.compile(model, options={"cache": False})
    with pytest.warns(CaptureFallbackWarning, match="sparse gradient"):
        compiled(idx).sum().backward()
    got, model.weight.grad = model.weight.grad, None
    model(idx).sum().backward()
    assert got is not None and got.is_sparse
    assert_bitwise(got.to_dense(), model.weight.grad.to_dense())


def test_sparse_embedding_compiles_for_inference() -> None:
    gen = torch.Generator().manual_seed(13)
    model = torch.nn.Embedding(6, 5, sparse=True)
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for _ in range(2):
            idx = _indices(gen, 6)
            assert_bitwise(compiled(idx), model(idx))

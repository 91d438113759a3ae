"""``nn.TransformerEncoder`` in eval mode, without grad and with a ``src_key_padding_mask``:
eager packs its input into a nested tensor by the mask and pads the result with zeros, a
capture takes the slow path, whose padded positions hold computed values. Such a call is
refused (the loud eager fallback; ``fullgraph=True`` raises), so results are eager's; without
a padding mask, or with ``enable_nested_tensor=False``, the encoder compiles whole."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_bitwise, contract_tol

NO_CACHE = {"cache": False}


def _encoder(nested: bool, mask_check: bool = True) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: PyTorch's nested tensors are a prototype
        enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested, mask_check=mask_check)
    return enc.eval()


def _padding(batch: int, length: int) -> torch.Tensor:
    """Left-aligned: each row keeps a random number of positions (at least one)."""
    keep = torch.randint(1, length + 1, (batch, 1))
    return torch.arange(length)[None, :] >= keep


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("mask_check", [True, False])
def test_a_padded_call_runs_eagerly_with_a_warning(mask_check: bool) -> None:
    enc = _encoder(nested=True, mask_check=mask_check)
    compiled = plait.compile(enc, options=NO_CACHE)
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning) as caught:
        for _ in range(3):
            x, pad = torch.randn(3, 6, 16), _padding(3, 6)
            got = compiled(x, src_key_padding_mask=pad)
            assert_bitwise(got, enc(x, src_key_padding_mask=pad))
    assert any("nested-tensor fast path" in str(w.message) for w in caught), caught.list


def test_fullgraph_names_the_fast_path() -> None:
    compiled = plait.compile(_encoder(nested=True), fullgraph=True, options=NO_CACHE)
    with torch.no_grad(), pytest.raises(GraphCaptureError, match="enable_nested_tensor=False"):
        compiled(torch.randn(2, 5, 16), src_key_padding_mask=_padding(2, 5))


@pytest.mark.parametrize("nested", [True, False])
def test_an_encoder_without_the_fast_path_compiles_whole(nested: bool) -> None:
    """NOTE: a padded call's layers take their own fast path (a masked one: the loud eager
    fallback, tests/capture/test_multihead_attention.py) unless eager's fast path is off."""
    enc = _encoder(nested=nested)
    compiled = plait.compile(enc, fullgraph=True, options=NO_CACHE)
    torch.backends.mha.set_fastpath_enabled(nested)
    try:
        with torch.no_grad():
            for _ in range(2):
                x = torch.randn(2, 5, 16)
                pad = _padding(2, 5) if not nested else None
                torch.testing.assert_close(
                    compiled(x, src_key_padding_mask=pad),
                    enc(x, src_key_padding_mask=pad),
                    **contract_tol("model", torch.float32),
                )
    finally:
        torch.backends.mha.set_fastpath_enabled(True)

"""The eager fallback of a masked attention fast-path call is guarded by the fast-path flag.

In eval mode without grad, given a mask, eager's ``nn.MultiheadAttention`` (and
``nn.TransformerEncoderLayer``, and ``nn.TransformerEncoder``'s nested-tensor path) takes
PyTorch's fast path, which a capture cannot take: the call runs eagerly, warned. Its fallback's
guards held only what capture read before the refusal, not the flag the refusal was decided by,
so ``torch.backends.mha.set_fastpath_enabled(False)`` after that call left it eager for good.
The fallback now holds the flag: turning it off captures again on the next call, which compiles
(and turning it back on is the fallback again), with eager's results in both states.

The same tensor passed as query, key and value (``attn(x, x, x)`` compiled alone, or as the
region of a module that falls back) must not take the slow path where eager takes the fast path
(a row whose every key is masked is 0 there, where eager's is NaN): it is traced as one tensor,
so ``query is key`` holds as in eager, and such a call is refused too (the loud eager
fallback)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol

NO_CACHE = {"cache": False}
_D, _HEADS = 16, 4


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and a padding mask whose second sequence masks every key."""
    g = torch.Generator().manual_seed(seed)
    pad = torch.rand(3, 5, generator=g) > 0.6
    pad[:, 0] = False
    pad[1] = True
    return torch.randn(3, 5, _D, generator=g), pad


@contextmanager
def _fast_path(enabled: bool) -> Iterator[None]:
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


class _Wrapped(nn.Module):
    """A module around the attention: its call falls back regionally."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(_D, _HEADS, batch_first=True)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0] * 2.0


def _program(kind: str) -> tuple[Callable[..., Any], Any]:
    """The eager program and what to compile."""
    torch.manual_seed(0)
    if kind == "module":
        m = _Wrapped().eval()
        return m, m
    if kind == "layer":
        layer = nn.TransformerEncoderLayer(_D, _HEADS, 32, dropout=0.0, batch_first=True).eval()

        def encode(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            return layer(x, src_key_padding_mask=pad)

        return encode, encode
    mha = nn.MultiheadAttention(_D, _HEADS, batch_first=True).eval()

    def attend(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]

    return attend, attend


def _fell_back(compiled: Any) -> bool:
    return compiled.specializations[-1].fallback_reason is not None


@pytest.mark.parametrize("kind", ["attention", "layer", "module"])
def test_turning_the_fast_path_off_after_a_fallback_compiles(kind: str) -> None:
    eager, target = _program(kind)
    compiled = plait.compile(target, options=NO_CACHE)
    with torch.no_grad():
        with pytest.warns(CaptureFallbackWarning, match="fast path"):
            got = compiled(*_batch(1))
        want = eager(*_batch(1))
        assert want.isnan().any()  # NOTE: eager's fast path: the fully masked rows
        assert_bitwise(got, want, "the eager fallback")
        assert _fell_back(compiled)
        with _fast_path(False):
            for seed in (2, 3):
                torch.testing.assert_close(
                    compiled(*_batch(seed)),
                    eager(*_batch(seed)),
                    **contract_tol("attention", torch.float32),
                )
            assert len(compiled.specializations) == 2
            assert not _fell_back(compiled)
        # NOTE: back on, the fallback's guards hold again: it runs (warned when it was made)
        assert_bitwise(compiled(*_batch(4)), eager(*_batch(4)), "the fast path back on")
        assert len(compiled.specializations) == 2


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_turning_the_fast_path_off_after_a_nested_encoder_fallback_compiles() -> None:
    layer = nn.TransformerEncoderLayer(_D, _HEADS, 32, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NOTE: PyTorch's nested tensors are a prototype
        enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    compiled = plait.compile(enc, options=NO_CACHE)

    def left_aligned(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        keep = torch.randint(1, 6, (3, 1), generator=g)
        return torch.randn(3, 5, _D, generator=g), torch.arange(5)[None, :] >= keep

    with torch.no_grad():
        x, pad = left_aligned(1)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = compiled(x, src_key_padding_mask=pad)
        assert any("nested-tensor fast path" in str(w.message) for w in seen), seen
        assert_bitwise(got, enc(x, src_key_padding_mask=pad), "the eager fallback")
        assert _fell_back(compiled)
        with _fast_path(False):
            for seed in (2, 3):
                x, pad = left_aligned(seed)
                torch.testing.assert_close(
                    compiled(x, src_key_padding_mask=pad),
                    enc(x, src_key_padding_mask=pad),
                    **contract_tol("model", torch.float32),
                )
            assert not _fell_back(compiled)


def test_one_tensor_as_query_key_and_value_is_eagers() -> None:
    """``attn(x, x, x)`` compiled alone: eager's fast path (NaN rows), never the slow path's 0."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(_D, _HEADS, batch_first=True).eval()
    compiled = plait.compile(mha, options=NO_CACHE)
    with torch.no_grad():
        for seed in range(3):
            x, pad = _batch(10 + seed)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CaptureFallbackWarning)
                got = compiled(x, x, x, key_padding_mask=pad, need_weights=False)[0]
            want = mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
            assert want.isnan().any()
            assert_bitwise(got, want)
        assert _fell_back(compiled)
        with _fast_path(False):
            x, pad = _batch(20)
            torch.testing.assert_close(
                compiled(x, x, x, key_padding_mask=pad, need_weights=False)[0],
                mha(x, x, x, key_padding_mask=pad, need_weights=False)[0],
                **contract_tol("attention", torch.float32),
            )
            assert not _fell_back(compiled)


def test_distinct_tensors_as_query_key_and_value_still_compile() -> None:
    """Cross attention (eager's slow path too) is no fast path call: it compiles."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(_D, _HEADS, batch_first=True).eval()
    compiled = plait.compile(mha, options=NO_CACHE)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for seed in range(2):
            x, pad = _batch(30 + seed)
            kv = torch.randn(3, 5, _D)
            torch.testing.assert_close(
                compiled(x, kv, kv, key_padding_mask=pad, need_weights=False)[0],
                mha(x, kv, kv, key_padding_mask=pad, need_weights=False)[0],
                **contract_tol("attention", torch.float32),
                equal_nan=True,
            )
    assert not _fell_back(compiled)

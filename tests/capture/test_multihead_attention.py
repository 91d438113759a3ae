"""``nn.MultiheadAttention`` (``F.multi_head_attention_forward``) without attention weights is
written with plait's ops (``plait.frontend.lower_attention``): self- and cross-attention, batch
first or not, and ``nn.TransformerEncoder`` compile in Stax with no opaque node and match eager
on fresh inputs; the forms the rule does not cover stay announced opaque nodes."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
import plait.conformance
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol


def _draw(*shapes: tuple[int, ...]) -> Callable[[int], tuple[torch.Tensor, ...]]:
    def draw(seed: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(*s, generator=g) for s in shapes)

    return draw


def _no_opaque(compiled: Any) -> None:
    for spec in compiled.specializations:
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0, counts


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_attention_without_weights_compiles(batch_first: bool, cross: bool) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=batch_first).eval()

    def program(x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        kv = memory if cross else x
        return mha(x, kv, kv, need_weights=False)[0]

    shapes = [(2, 5, 16), (2, 7, 16)] if batch_first else [(5, 2, 16), (7, 2, 16)]
    compiled = plait.compile(program, backend="stax", fullgraph=True)
    with torch.no_grad():
        compiled(*_draw(*shapes)(100))
        report = plait.conformance.check(
            program, compiled, _draw(*shapes), candidate_module=mha, op_class="attention", draws=3
        )
    assert report.ok, str(report)
    _no_opaque(compiled)


@pytest.mark.slow
def test_transformer_encoder_compiles() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    compiled = plait.compile(model, backend="stax", fullgraph=True)
    with torch.no_grad():
        report = plait.conformance.check(model, compiled, _draw((2, 6, 32)), draws=2)
    assert report.ok, str(report)
    _no_opaque(compiled)


@pytest.mark.parametrize(
    "call",
    [
        lambda mha, x: mha(x, x, x)[0],  # NOTE: need_weights=True is the default
        lambda mha, x: mha(x, x, x, need_weights=False, attn_mask=torch.ones(5, 5).tril() == 0)[0],
        lambda mha, x: mha(x, x, x, need_weights=False, key_padding_mask=x[..., 0] > 1)[0],
    ],
    ids=["weights", "attn-mask", "key-padding-mask"],
)
def test_forms_with_no_rule_are_aten_nodes_or_announced_opaque_nodes(
    call: Callable[..., Any],
) -> None:
    """A form with no capture rule of its own compiles through its ATen graph (extern
    nodes) or runs as an opaque node, announced by a warning exactly when one is opaque.
    NOTE: eager's fast path off (with a mask it is the loud eager fallback: test below)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        _aten_or_opaque(mha, call)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def _aten_or_opaque(mha: nn.MultiheadAttention, call: Callable[..., Any]) -> None:

    def program(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = call(mha, x)
        return out

    compiled = plait.compile(program, backend="stax")
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled(*_draw((2, 5, 16))(100))
    announced = any(w.category is CaptureFallbackWarning for w in seen)
    (spec,) = compiled.specializations
    assert announced == bool(spec.opaque_counts), ([str(w.message) for w in seen], spec)
    with torch.no_grad():
        report = plait.conformance.check(
            program, compiled, _draw((2, 5, 16)), candidate_module=mha, op_class="attention"
        )
    assert report.ok, str(report)


def _fully_masked(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch whose second sequence masks every key, and an attention mask row likewise."""
    g = torch.Generator().manual_seed(seed)
    pad = torch.rand(3, 5, generator=g) > 0.6
    pad[1] = True
    return torch.randn(3, 5, 16, generator=g), pad


@pytest.mark.parametrize("module", ["attention", "layer"])
def test_a_masked_fast_path_call_is_eagers_with_a_warning(module: str) -> None:
    """In eval mode without grad, given a mask, eager takes the fast path, whose fully masked
    rows are NaN where the slow path a capture takes gives 0: the call runs eagerly, warned;
    with the fast path turned off, it compiles (and the flag's change recompiles)."""
    torch.manual_seed(0)
    if module == "attention":
        mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()

        def program(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            return mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]
    else:
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).eval()

        def program(x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
            return layer(x, src_key_padding_mask=pad)

    with torch.no_grad():
        compiled = plait.compile(program, options={"cache": False})
        with pytest.warns(CaptureFallbackWarning, match="fast path"):
            got = compiled(*_fully_masked(1))
        want = program(*_fully_masked(1))
        assert want.isnan().any()  # NOTE: eager's fast path: the fully masked rows
        assert_bitwise(got, want, "the eager fallback")
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            compiled = plait.compile(program, options={"cache": False})
            for seed in (2, 3):
                torch.testing.assert_close(
                    compiled(*_fully_masked(seed)),
                    program(*_fully_masked(seed)),
                    **contract_tol("attention", torch.float32),
                )
            assert compiled.specializations[0].fallback_reason is None
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
        with pytest.warns(CaptureFallbackWarning, match="fast path"):  # NOTE: the flag's guard
            assert_bitwise(compiled(*_fully_masked(4)), program(*_fully_masked(4)))
        assert len(compiled.specializations) == 2

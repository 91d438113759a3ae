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
    nodes) or runs as an opaque node, announced by a warning exactly when one is opaque."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()

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

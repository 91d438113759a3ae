"""Hugging Face MobileNetV2, EfficientNet and Swin (small configs, random weights) compile whole
into Stax with no opaque node: their ``F.pad`` (MobileNetV2's and EfficientNet's "same"
padding, Swin's window padding), Swin's ``torch.roll`` (shifted windows) and its
``adaptive_avg_pool1d`` pooler run natively or as externs, and the conformance gate passes them
against eager on fresh inputs under the contract's "model" row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

import plait
import plait.conformance
from tests.codegen.hf_vision_models import efficientnet, mobilenet_v2

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-hf-vision")]

SHAPE = (1, 3, 32, 32)


def _swin() -> Any:
    # NOTE: two blocks per stage: the second one shifts its windows (torch.roll).
    cfg = transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4
    )
    return transformers.SwinModel(cfg)


MODELS: dict[str, tuple[Callable[[], Any], set[str]]] = {
    "mobilenet_v2": (mobilenet_v2, {"constant_pad"}),
    "efficientnet": (efficientnet, {"constant_pad"}),
    "swin": (_swin, {"constant_pad", "roll"}),
}


def _images(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)),)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_compiles_with_no_opaque_node_and_passes_the_gate(name: str) -> None:
    build, expected_ops = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    compiled = plait.compile(model, backend="stax", fullgraph=True)
    with torch.no_grad():
        report = plait.conformance.check(
            lambda x: model(x).last_hidden_state,
            lambda x: compiled(x).last_hidden_state,
            _images,
            reference_module=model,
            candidate_module=model,
            op_class="model",
            draws=2,
        )
    assert report.ok, str(report)
    for spec in compiled.specializations:
        assert spec.graph is not None and spec.fallback_reason is None
        ops = {n.op for n in spec.graph.nodes}
        assert "opaque" not in ops and expected_ops <= ops, sorted(ops)
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["fallback"] == 0, counts

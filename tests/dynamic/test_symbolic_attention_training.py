"""Training through scaled-dot-product attention with symbolic sizes: the capture records
attention's fused CPU kernel and its backward as ``aten`` nodes, typed at symbolic dims by
probing their meta kernels (``plait.ir.ops.aten_symbolic``); one specialization serves every
sequence length, forward and backward run by Stax, judged by the gate with gradients (Hugging
Face BERT built from a config, and the benchmark's GPT-2 block). Before, Stax refused those
nodes and the reference interpreter ran the program."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
import plait.conformance
from benchmarks.models.gpt2 import Block, GPT2Config


class _Bert(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import transformers

        cfg = transformers.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
            vocab_size=100, max_position_embeddings=64, attn_implementation="sdpa",
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        self.bert = transformers.BertModel(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids).last_hidden_state


def _ids(t: int) -> Callable[[int], tuple[torch.Tensor]]:
    return lambda seed: (
        torch.randint(0, 100, (2, t), generator=torch.Generator().manual_seed(seed)),
    )


def _activations(t: int) -> Callable[[int], tuple[torch.Tensor]]:
    return lambda seed: (torch.randn(2, t, 32, generator=torch.Generator().manual_seed(seed)),)


CASES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], Any]]] = {
    "hf-bert": (_Bert, _ids),
    "block": (lambda: Block(GPT2Config(d_model=32, n_head=4, attention="sdpa")), _activations),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_trains_at_every_length_from_one_specialization(name: str) -> None:
    make, inputs = CASES[name]
    torch.manual_seed(0)
    model = make().train()
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    for t in (5, 9, 16, 23):
        report = plait.conformance.check(
            model, compiled, inputs(t), grads=True, draws=2, candidate_module=model
        )
        assert report.ok, f"length {t}: {report}"
    (spec,) = plait.explain(compiled).specializations
    manifest = spec.manifest
    assert manifest.executor["backend"] == "stax", manifest.executor.get("backend")
    assert manifest.fallbacks == [] and "backward" in manifest.executor
    assert manifest.executor["backward"]["backend"] == "stax"


def test_a_probed_result_dim_must_be_a_constant_or_a_symbol() -> None:
    """Two assignments of the symbols, in two orders, tell ``2 * s0`` and ``max(s0, s1)`` from
    a symbol: both raise."""
    from plait.ir.ops.aten_symbolic import probed_types
    from plait.ir.ops.registry import TypeRuleError
    from plait.ir.types import TensorType
    from plait.symbolic import symbol

    s0, s1 = symbol("s0"), symbol("s1")
    ops = (TensorType((s0, s1, 3), torch.float32),)

    def typed(dims: Callable[[tuple[int, ...]], tuple[int, ...]]) -> Any:
        return lambda o: [TensorType(dims(tuple(o[0].shape)), torch.float32)]

    kept = probed_types(typed(lambda s: (s[1], 3, s[0])), ops)
    assert kept[0].shape == (s1, 3, s0)
    for bad in (lambda s: (2 * s[0],), lambda s: (max(s[0], s[1]),)):
        with pytest.raises(TypeRuleError, match="neither a constant nor"):
            probed_types(typed(bad), ops)


class _Vit(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import transformers

        cfg = transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
            image_size=16, patch_size=8, num_labels=5, attn_implementation="sdpa",
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        self.vit = transformers.ViTForImageClassification(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=x).logits


def test_a_vit_keeps_its_batch_symbolic_where_its_image_size_cannot_be() -> None:
    """ViT's patch count, ``floor(s2 / 8) ** 2 + 1``, cannot be related to its position table's
    5 rows: the capture restarts with the size that expression names (the height) static, not
    every size of the operands (the batch too, which made one specialization per batch)."""
    torch.manual_seed(0)
    model = _Vit().train()
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    for b in (2, 3, 5):

        def images(seed: int, b: int = b) -> tuple[torch.Tensor]:
            return (torch.randn(b, 3, 16, 16, generator=torch.Generator().manual_seed(seed)),)

        report = plait.conformance.check(
            model, compiled, images, grads=True, draws=2, candidate_module=model
        )
        assert report.ok, f"batch {b}: {report}"
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    (x,) = [v for v in compiled.specializations[0].graph.inputs if v.kind == "user"]
    assert not isinstance(x.type.shape[0], int) and x.type.shape[1:] == (3, 16, 16), x.type

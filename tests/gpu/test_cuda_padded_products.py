"""A language-model head over a vocabulary that is not a multiple of 8, trained on CUDA under
bfloat16 autocast: its product runs on operands zero-padded as it runs
(``plait.codegen.cuda_padding``), both gradient products on one cotangent padded in the graph
(``plait.passes.pad_products``), and the step passes the gate (outputs and gradients).
Skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import plait
from tests.autograd.test_training_autocast import gate_bf16_training

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

VOCAB = 1001


class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.mix = nn.Linear(64, 64)
        self.head = nn.Linear(64, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.mix(self.embed(ids))))


def _draw(seed: int) -> tuple[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (4, 32), generator=gen).cuda(),)


def test_a_vocabulary_head_trains_on_padded_products() -> None:
    torch.manual_seed(0)
    model = _TinyLM().cuda().train()
    compiled = plait.compile(copy.deepcopy(model))
    gate_bf16_training(model, compiled, _draw, "cuda")
    (spec,) = compiled.specializations
    manifest = spec.compiled.manifest
    executor = manifest.executor
    # NOTE: the head's product, padded as it runs (its result is returned: a view)
    padded = [n for n in executor["evidence"]["nodes"] if "zero-padded" in n["detail"]]
    assert len(padded) >= 1, padded
    # NOTE: its two gradient products, on one cotangent padded in the graph (pad-products)
    rewrites = [
        r
        for p in manifest.autograd["passes"]["backward"]
        if p["name"] == "pad-products"
        for r in p["rewrites"]
    ]
    assert len(rewrites) >= 2, rewrites
    backward = executor["backward"]["evidence"]["nodes"]
    assert not [n for n in backward if "zero-padded" in n["detail"]], backward

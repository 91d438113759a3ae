"""Training attention with dropout where a query row is masked out entirely (a padded position
under a causal and padding mask, as Hugging Face models build it): eager's math path gives that
row zero weights (``_safe_softmax``), never NaN, and so does the compiled program."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.autograd.test_training import seeded_grads_as_eager
from tests.util import contract_tol

TOL = contract_tol("attention", torch.float32)


def _masks() -> dict[str, torch.Tensor]:
    keep = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    keep[1, :, :, :2] = False  # NOTE: two left-padded keys: rows 0 and 1 of batch 1 keep none
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    return {"bool": keep, "additive": additive}


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attention_dropout_gives_fully_masked_rows_zero_weights(kind: str) -> None:
    mask = _masks()[kind]

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=0.25
        )

    compiled = plait.compile(attend, backend="stax", options={"cache": False})
    gen = torch.Generator().manual_seed(3)
    for seed in (1, 2):
        qkv = [torch.randn(2, 2, 6, 4, generator=gen) for _ in range(3)]
        g = torch.randn(2, 2, 6, 4, generator=gen)
        seeded_grads_as_eager(attend, compiled, qkv, g, seed, TOL)

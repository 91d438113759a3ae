"""Automatic dynamic made an optional argument's dims symbolic; a later call that leaves that
argument out (``None``, or not passed: Hugging Face models called without ``attention_mask``
after calls with masks of several lengths) is a new specialization that answers as eager does,
never an error naming the absent argument."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import transformers

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning

TOL = plait.contract.load().tolerance("model", torch.float32)


def _close(got: Any, want: Any) -> None:
    torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


def _x(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _scaled(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return x * 2 if mask is None else x * mask


def test_a_function_called_without_an_argument_automatic_dynamic_made_symbolic() -> None:
    compiled = plait.compile(_scaled, options={"cache": False})
    for seed, n in enumerate((4, 6)):
        x, mask = _x(n, 3, seed=seed), _x(n, 3, seed=10 + seed)
        _close(compiled(x, mask), _scaled(x, mask))
    for seed in range(3):
        x = _x(5, 3, seed=20 + seed)
        _close(compiled(x), _scaled(x))


def test_bert_called_without_attention_mask_after_masks_of_two_lengths() -> None:
    cfg = transformers.BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    compiled = plait.compile(model, options={"cache": False})

    def ids(n: int, seed: int) -> torch.Tensor:
        return torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(seed))

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed, n in enumerate((8, 6)):
            mask = torch.ones(2, n, dtype=torch.long)
            mask[1, -2:] = 0
            got = compiled(ids(n, seed), attention_mask=mask).last_hidden_state
            _close(got, model(ids(n, seed), attention_mask=mask).last_hidden_state)
        for seed in range(2):
            got = compiled(ids(7, 30 + seed)).last_hidden_state
            _close(got, model(ids(7, 30 + seed)).last_hidden_state)

"""Hugging Face GPT-2 with ``use_cache=True`` through the Stax backend.

Its attention projections (``Conv1D``: ``torch.addmm``) run as PyTorch fallbacks whose result is
split into the query, key and value views that attention (an extern) reads and the key/value
cache returns. The planner's layout dry run read those views' base before any sample of a
fallback's result existed (a KeyError at compile time). Logits and every cached key and value
are judged against eager on fresh token ids, under the contract's model row. The output's
``DynamicCache`` is rebuilt on every call from the attributes it was returned with (a plain
object that ``copy.copy`` rebuilds), so the whole model runs in Stax.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import plait
import plait.conformance
import plait.contract
import plait.errors

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-models")]

VOCAB = 1000


def _logits(out: Any) -> tuple[torch.Tensor]:
    return (out.logits,)


def _cache(out: Any) -> tuple[torch.Tensor, ...]:
    """Each layer's cached keys and values."""
    cache = out.cache
    assert cache is not None and len(cache.layers) == 2, "the model should return its cache"
    return tuple(t for layer in cache.layers for t in (layer.keys, layer.values))


def _tokens(seed: int) -> tuple[torch.Tensor]:
    return (torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(seed)),)


def _check(part: Any) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB)
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled = plait.compile(model, backend="stax")
    with torch.no_grad():
        report = plait.conformance.check(
            lambda ids: part(model(ids, use_cache=True)),
            lambda ids: part(compiled(ids, use_cache=True)),
            _tokens, candidate_module=model, op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    for spec in compiled.specializations:
        counts = spec.manifest.executor["evidence"]["counts"]
        assert counts["native"] > 0 and counts["extern"] > 0, counts


@pytest.mark.slow
def test_gpt2_lm_head_with_kv_cache_logits_match_eager() -> None:
    _check(_logits)


@pytest.mark.slow
def test_gpt2_lm_head_kv_cache_tensors_match_eager() -> None:
    _check(_cache)


@pytest.mark.slow
def test_gpt2_returned_cache_is_each_calls_own_and_decodes_the_next_token() -> None:
    """Each call returns a new DynamicCache holding that call's tensors (never the capture's,
    never shared between calls), and eager decoding from it gives eager's next-token logits."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB)
    model = transformers.GPT2LMHeadModel(config).eval()
    compiled = plait.compile(model, backend="stax")
    with torch.no_grad():
        first = compiled(*_tokens(1), use_cache=True).cache
        second = compiled(*_tokens(2), use_cache=True).cache
        want = model(*_tokens(2), use_cache=True).cache
        assert first is not second and first.layers[0] is not second.layers[0]
        assert type(second) is type(want) and type(second.layers[0]) is type(want.layers[0])

    def decoding_after(run: Any) -> Any:
        def decode(ids: torch.Tensor) -> tuple[torch.Tensor]:
            cache = run(ids[:, :-1], use_cache=True).cache
            return (model(ids[:, -1:], cache=cache, use_cache=True).logits,)

        return decode

    with torch.no_grad():
        report = plait.conformance.check(
            decoding_after(model), decoding_after(compiled), _tokens,
            candidate_module=model, op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    assert all(spec.fallback_reason is None for spec in compiled.specializations)

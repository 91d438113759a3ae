"""Hugging Face GPT2Model, LlamaModel and BertModel (small configs, random weights) compile as
one graph through ``plait.compile``: no whole-program fallback (their mask code calls
``torch.diff(x, prepend=t)`` and ``torch.gather(x, 1, index=t)`` with tensor keywords, reads a
constant packed-sequence check, and Llama's SDPA uses ``enable_gqa``), and match eager bitwise
on fresh token ids, in no-grad inference and with gradients (parameter gradients within the
contract: the backward's products read other layouts than eager's)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

import plait
from plait.errors import CaptureFallbackWarning
from tests.capture.helpers import assert_same
from tests.util import contract_tol


def _gpt2(attn: str) -> Any:
    cfg = transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0, attn_implementation=attn,
    )  # fmt: skip
    return transformers.GPT2Model(cfg)


def _llama(attn: str) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation=attn,
    )  # fmt: skip
    return transformers.LlamaModel(cfg)


def _bert(attn: str) -> Any:
    cfg = transformers.BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=32, attn_implementation=attn,
    )  # fmt: skip
    return transformers.BertModel(cfg)


MODELS: dict[str, tuple[Callable[[str], Any], dict[str, Any]]] = {
    "gpt2": (_gpt2, {"use_cache": False}),
    "llama": (_llama, {"use_cache": False}),
    "bert": (_bert, {}),
}


def _ids(i: int) -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(50 + i))


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_compiles_whole_and_matches_eager(name: str, attn: str) -> None:
    build, kwargs = MODELS[name]
    torch.manual_seed(0)
    model = build(attn).eval()
    compiled = plait.compile(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: the opaque nodes
        with torch.no_grad():
            for i in range(2):
                got = compiled(_ids(i), **kwargs).last_hidden_state
                assert_same(got, model(_ids(i), **kwargs).last_hidden_state, f"call {i}")
    spec = compiled.specializations[0]
    assert spec.fallback_reason is None, spec.fallback_reason
    assert spec.graph is not None
    assert len(compiled.specializations) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_gradients_match_eager(name: str) -> None:
    # NOTE: grad mode on: Llama's rotary embedding is a `@torch.no_grad()` method, a grad-mode
    # region captured inside the program
    build, kwargs = MODELS[name]
    torch.manual_seed(0)
    model = build("sdpa").eval()
    reference = build("sdpa").eval()
    reference.load_state_dict(model.state_dict())
    compiled = plait.compile(model, backend="eager")
    for i in range(2):
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(_ids(i), **kwargs).last_hidden_state
        want = reference(_ids(i), **kwargs).last_hidden_state
        assert_same(got, want, f"call {i}")
        got.pow(2).sum().backward()
        want.pow(2).sum().backward()
        for (path, p), q in zip(model.named_parameters(), reference.parameters()):
            assert (p.grad is None) == (q.grad is None), path
            if p.grad is not None:
                # NOTE: within the contract, not bitwise: the backward's products and attention
                # read the graph's contiguous values where eager's read strided views, and on
                # AVX-512 CPUs their last bits follow the layout (Llama's GQA attention)
                torch.testing.assert_close(
                    p.grad, q.grad, **contract_tol("model", p.grad.dtype), msg=f"{path}, {i}"
                )
    assert compiled.specializations[0].fallback_reason is None

"""Decoding with a key/value cache passed back in: the cache an input object plait opens.

A Hugging Face ``DynamicCache`` (and its ``DynamicLayer``s) is a plain object that ``copy.copy``
rebuilds from its ``__dict__``: as an input, its tensors are program inputs (the growing
sequence dim turns symbolic under automatic dynamic, so a decode loop settles on a few
specializations) and its other attributes are guarded by value. What the program does to it
(``layer.keys = torch.cat(...)``) is done to the caller's own object after each compiled call,
as eager's in-place update does, and the call returns the caller's object where eager does.
GPT-2 and a Llama-style model decode side by side with eager on fresh token ids; logits and
every cached key and value are judged under the contract's model row. A user's own cache-like
object gets the same write-back, and one plait cannot write back (slots) is refused loudly.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from torch import nn

import plait
from plait.errors import GraphCaptureError
from tests.util import assert_bitwise, contract_tol

pytestmark = [pytest.mark.usefixtures("stax_cache"), pytest.mark.xdist_group("stax-models")]

VOCAB = 100
STEPS = 14
MAX_SPECIALIZATIONS = 4  # prefill, the first decode (static), decode with a symbolic length


def _gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def _llama() -> nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _assert_same_cache(got: Any, want: Any, step: int) -> None:
    tol = contract_tol("model", torch.float32)
    assert type(got) is type(want) and len(got.layers) == len(want.layers), step
    assert got.get_seq_length() == want.get_seq_length(), step
    for i, (a, b) in enumerate(zip(got.layers, want.layers)):
        assert type(a) is type(b) and a.is_initialized == b.is_initialized, (step, i)
        for name in ("keys", "values"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is torch.Tensor, f"step {step} layer {i} {name}: {type(x)}"
            torch.testing.assert_close(x, y, **tol, msg=f"step {step} layer {i} {name}")


@pytest.mark.slow
@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_decoding_from_a_passed_cache_updates_the_callers_cache_like_eager(make: Any) -> None:
    torch.manual_seed(0)
    model = make().eval()
    compiled = plait.compile(model)
    tol = contract_tol("model", torch.float32)
    draw = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ids = torch.randint(0, VOCAB, (2, 7), generator=draw)
        want, got = model(ids, use_cache=True), compiled(ids, use_cache=True)
        torch.testing.assert_close(got.logits, want.logits, **tol)
        want_cache, got_cache = want.cache, got.cache
        _assert_same_cache(got_cache, want_cache, -1)
        for step in range(STEPS):
            ids = torch.randint(0, VOCAB, (2, 1), generator=draw)
            want = model(ids, cache=want_cache, use_cache=True)
            got = compiled(ids, cache=got_cache, use_cache=True)
            torch.testing.assert_close(got.logits, want.logits, **tol, msg=f"step {step}")
            # NOTE: eager updates the cache passed in and returns it; so must the compiled call
            assert (got.cache is got_cache) == (want.cache is want_cache)
            _assert_same_cache(got_cache, want_cache, step)
            want_cache, got_cache = want.cache, got.cache
    assert want_cache.get_seq_length() == 7 + STEPS
    assert len(compiled.specializations) <= MAX_SPECIALIZATIONS, compiled.recompile_reasons
    assert all(s.fallback_reason is None for s in compiled.specializations)


class Memory:
    """A user's cache: a list of tensors, a running total written in place, a counter."""

    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []
        self.total = torch.zeros(3)
        self.calls = 0


class Remember(nn.Module):
    def forward(self, x: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, Memory]:
        memory.items.append(x * 2)
        memory.total.add_(x)
        memory.calls += 1
        return torch.stack(memory.items).sum(0) + memory.total, memory


def test_a_users_object_gets_the_programs_changes_after_each_compiled_call() -> None:
    model = Remember()
    compiled = plait.compile(model, fullgraph=True)
    want_memory, got_memory = Memory(), Memory()
    for step in range(3):
        x = torch.randn(3)
        want, want_back = model(x, want_memory)
        got, got_back = compiled(x, got_memory)
        assert got_back is got_memory and want_back is want_memory
        assert_bitwise(got, want)
        assert got_memory.calls == want_memory.calls == step + 1
        assert len(got_memory.items) == len(want_memory.items) == step + 1
        for a, b in zip(got_memory.items, want_memory.items):
            assert type(a) is torch.Tensor
            assert_bitwise(a, b)
        assert type(got_memory.total) is torch.Tensor
        assert_bitwise(got_memory.total, want_memory.total)


class Slotted:
    """No ``__dict__``: plait passes it as it is and cannot write it back."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = torch.zeros(3)


class Accumulate(nn.Module):
    def forward(self, x: torch.Tensor, box: Slotted) -> torch.Tensor:
        box.state = box.state + x
        return box.state * 2


def test_a_write_plait_cannot_reproduce_is_refused_and_leaves_the_object_as_eager_does() -> None:
    x = torch.randn(3)
    box = Slotted()
    with pytest.raises(GraphCaptureError, match="cannot write back"):
        plait.compile(Accumulate(), fullgraph=True)(x, box)
    assert type(box.state) is torch.Tensor and torch.equal(box.state, torch.zeros(3))

    compiled = plait.compile(Accumulate())
    with pytest.warns(plait.errors.CaptureFallbackWarning, match="cannot write back"):
        out = compiled(x, box)
    assert_bitwise(out, x * 2)
    assert type(box.state) is torch.Tensor and torch.equal(box.state, x)
    assert compiled.specializations[0].fallback_reason is not None

"""``torch.compiler.is_compiling()`` is True on the capturing thread, as under torch.compile:
a program that reads tensor data only when not compiling (transformers' padding-mask check)
compiles whole, and computes what eager computes on fresh inputs; other threads keep PyTorch's
answer while a capture runs, and every thread has it back after."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

pytestmark = pytest.mark.usefixtures("plait_cache_dir")


class _MaskedMean(nn.Module):
    """Skips an all-ones mask when it may read data, as transformers' mask code does."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if not torch.compiler.is_compiling() and bool(mask.all()):
            return h.mean(1)
        w = mask.unsqueeze(-1).to(h.dtype)
        return (h * w).sum(1) / w.sum(1)


def test_a_check_skipped_under_compiling_compiles_whole() -> None:
    torch.manual_seed(0)
    model = _MaskedMean().eval()
    compiled = plait.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(3, 5, 8, generator=g)
            mask = torch.ones(3, 5, dtype=torch.long)
            mask[seed % 3, : seed + 1] = 0 if seed else 1  # NOTE: the first draw has no padding
            with torch.no_grad():
                torch.testing.assert_close(
                    compiled(x, mask), model(x, mask), **contract_tol("model", torch.float32)
                )
    (spec,) = compiled.specializations
    assert spec.program.fallback_reason is None
    assert torch.compiler.is_compiling() is False


def test_other_threads_see_pytorchs_answer_during_a_capture() -> None:
    inside, seen = threading.Event(), threading.Event()
    answers: dict[str, bool] = {}

    def program(x: torch.Tensor) -> torch.Tensor:
        inside.set()
        assert seen.wait(30)
        return x * 2 if torch.compiler.is_compiling() else x * 3

    def other() -> None:
        assert inside.wait(30)
        answers["other thread"] = torch.compiler.is_compiling()
        seen.set()

    t = threading.Thread(target=other)
    t.start()
    compiled = plait.compile(program)
    x = torch.randn(4)
    # NOTE: the compiling branch, as torch.compile gives: the capturing thread saw True
    torch.testing.assert_close(compiled(x), x * 2, **contract_tol("pointwise", torch.float32))
    t.join()
    assert answers == {"other thread": False}
    assert torch.compiler.is_compiling() is False


def test_padded_decoder_batch_compiles_whole() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=97, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.MistralModel(cfg).eval()
    compiled = plait.compile(model)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 97, (2, 7), generator=g)
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1, : seed + 1] = 0
        with torch.no_grad():
            got = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            want = model(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
    (spec,) = compiled.specializations
    assert spec.program.fallback_reason is None  # NOTE: the mask's data read refused it whole

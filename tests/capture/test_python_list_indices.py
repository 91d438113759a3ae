"""Indexing with a flat Python list of ints (eager's implicit index tensor:
``fused_qkv[..., [-2], :]`` in Hugging Face's Falcon with multi-query attention) compiles whole
and matches eager on fresh inputs: the listed positions (negative ones wrapped) gathered into a
copy, never a view of the indexed tensor. The program ran eagerly before (a whole-program
fallback). A list of bools, a nested list and an empty one still refuse, as before."""

from __future__ import annotations

import warnings

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise, contract_tol


def _indexed(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.view(2, 3, 6, 4)
    last = y[..., [-2], :]
    last.add_(1.0)  # NOTE: a copy: y and x keep their values
    return last, y[:, [2, 0, 2]], y[[1]], x[0, [1, 1], 3:], y.sum(-1)


def _fresh(seed: int) -> torch.Tensor:
    return torch.randn(2, 3, 24, generator=torch.Generator().manual_seed(seed))


def test_list_indices_compile_whole_and_match_eager_bitwise() -> None:
    compiled = plait.compile(_indexed)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for seed in range(3):
            x = _fresh(seed)
            for i, (got, want) in enumerate(zip(compiled(x.clone()), _indexed(x.clone()))):
                assert_bitwise(got, want, f"draw {seed} output {i}")
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None, spec.fallback_reason


@pytest.mark.parametrize(
    "index", [[True, False, False, True], [[0], [1]], []], ids=["bools", "nested", "empty"]
)
def test_other_lists_still_fall_back_with_a_warning(index: list) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x[:, index] * 2

    x = _fresh(5)[0][:, :4]
    with pytest.warns(CaptureFallbackWarning):
        got = plait.compile(f)(x)
    assert_bitwise(got, f(x))


def test_falcon_multi_query_attention_compiles_whole_and_matches_eager() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.FalconConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
    )
    torch.manual_seed(0)
    model = transformers.FalconForCausalLM(cfg).eval()
    assert cfg.multi_query
    compiled = plait.compile(model)
    for seed in range(3):
        ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            got = compiled(ids, use_cache=False).logits
            want = model(ids, use_cache=False).logits
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None, spec.fallback_reason


def test_list_index_gradients_match_eager() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x[:, [2, 0, 2, -1]] * x[:, [1, 1, 0, 3]]).sum(0)

    compiled = plait.compile(f)
    for seed in range(3):
        x = _fresh(seed)[0][:, :4].requires_grad_()
        cot = torch.randn(4, generator=torch.Generator().manual_seed(20 + seed))
        (want,) = torch.autograd.grad(f(x), x, cot)
        (got,) = torch.autograd.grad(compiled(x), x, cot)
        torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))

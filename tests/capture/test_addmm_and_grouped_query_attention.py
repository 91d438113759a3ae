"""``torch.addmm`` with a bias row (Hugging Face's ``Conv1D`` in GPT-2) lowers to ``linear`` with
the transposed weight, and ``scaled_dot_product_attention(enable_gqa=True)`` (Llama's grouped
key/value heads) to the attention extern with ``enable_gqa`` (PyTorch's kernel, as eager): both
compile with no opaque node and match eager on fresh inputs under the contract's row for their
op class. The forms with no IR op (scaled addmm, a 2-D bias) are typed ATen extern nodes."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers

import plait
import plait.conformance
from plait.errors import CaptureFallbackWarning


def _compiled_without_opaque(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    compiled = plait.compile(fn, backend="stax", fullgraph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        compiled(*args)
    (spec,) = compiled.specializations
    counts = spec.manifest.executor["evidence"]["counts"]
    assert counts["fallback"] == 0 and counts["extern"] >= 1, counts
    return compiled


@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 7, 1), (16, 32, 8)])
def test_addmm_with_a_bias_row_is_linear(shape: tuple[int, int, int]) -> None:
    m, k, n = shape

    def program(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.addmm(b, x, w).tanh()

    args = (torch.randn(n), torch.randn(m, k), torch.randn(k, n))
    compiled = _compiled_without_opaque(program, *args)
    report = plait.conformance.check(program, compiled, args, op_class="matmul", draws=3)
    assert report.ok, str(report)


@pytest.mark.parametrize(
    "program",
    [
        lambda b, x, w: torch.addmm(b, x, w, beta=0.5),
        lambda b, x, w: torch.addmm(b, x, w, alpha=2.0),
        lambda b, x, w: torch.addmm(b.expand(3, -1).contiguous(), x, w),
    ],
    ids=["beta", "alpha", "2-d-bias"],
)
def test_addmm_forms_with_no_ir_op_are_aten_extern_nodes(program: Any) -> None:
    args = (torch.randn(5), torch.randn(3, 4), torch.randn(4, 5))
    compiled = plait.compile(program, backend="stax", fullgraph=True)
    compiled(*args)
    (spec,) = compiled.specializations
    assert spec.manifest.graph["aten_externs"].get("aten.addmm", 0) == 1
    assert not spec.manifest.fallbacks
    fresh = (torch.randn(5), torch.randn(3, 4), torch.randn(4, 5))
    report = plait.conformance.check(program, compiled, fresh, op_class="matmul", draws=2)
    assert report.ok, str(report)


@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (6, 1)], ids=["4-per-kv", "mha", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_repeats_key_value_heads(
    heads: tuple[int, int], causal: bool
) -> None:
    hq, hkv = heads

    def program(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    args = (torch.randn(2, hq, 5, 8), torch.randn(2, hkv, 5, 8), torch.randn(2, hkv, 5, 8))
    compiled = _compiled_without_opaque(program, *args)
    report = plait.conformance.check(program, compiled, args, op_class="attention", draws=3)
    assert report.ok, str(report)


@pytest.mark.slow
def test_llama_with_grouped_key_value_heads_and_gpt2_compile_without_opaque_nodes() -> None:
    torch.manual_seed(0)
    llama = transformers.LlamaModel(
        transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        )
    ).eval()  # fmt: skip
    gpt2 = transformers.GPT2Model(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    ).eval()
    for model in (llama, gpt2):
        compiled = plait.compile(model, backend="stax")
        with torch.no_grad():
            compiled(torch.randint(0, 64, (1, 6)))
            report = plait.conformance.check(
                lambda ids, m=model: m(ids).last_hidden_state,
                lambda ids, c=compiled: c(ids).last_hidden_state,
                (torch.randint(0, 64, (1, 6)),), candidate_module=model, draws=2,
            )  # fmt: skip
        assert report.ok, str(report)
        for spec in compiled.specializations:
            fallbacks = [str(f) for f in spec.manifest.fallbacks]
            assert not [f for f in fallbacks if "addmm" in f or "scaled_dot" in f], fallbacks

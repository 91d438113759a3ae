"""Causal self-attention on the CPU in blocks of query rows (``plait.codegen.causal_attention``):
within the contract's attention row of eager's kernel at every length around the block and
range bounds, chosen only where it applies, named in the evidence, and per call under a symbolic
sequence length."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen import causal_attention
from plait.ir import GraphBuilder, TensorType
from plait.runtime import compile_graph
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.util import contract_tol

ATTN = contract_tol("attention", torch.float32)
LENGTHS = [
    causal_attention.MIN_LEN - 1,
    causal_attention.MIN_LEN,
    causal_attention.ROWS * 3 + 5,
    512,
    causal_attention.MAX_LEN,
    causal_attention.MAX_LEN + 1,
]


def _heads(gen: torch.Generator, batch: int, length: int) -> list[torch.Tensor]:
    """q, k, v as transposed views of one projection, as GPT-2 makes them."""
    qkv = torch.randn(batch, length, 3 * 48, generator=gen)
    return [t.view(batch, length, 3, 16).transpose(1, 2) for t in qkv.split(48, dim=2)]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_row_blocks_match_eager(length: int, scale: float | None) -> None:
    attend = causal_attention.causal_in_row_blocks(scale)
    gen = torch.Generator().manual_seed(length)
    for _ in range(2):
        q, k, v = _heads(gen, 2, length)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        got = attend(q, k, v, None)
        torch.testing.assert_close(got, want, **ATTN)
        # NOTE: the whole-sequence kernel's layout, which the plan's dry run recorded
        assert got.stride() == want.stride()


def _attention_graph(causal: bool, mask: bool, dtype: torch.dtype) -> tuple[object, list[str]]:
    gb = GraphBuilder()
    q, k, v = (gb.input(n, TensorType((1, 2, 256, 16), dtype)) for n in "qkv")
    m = gb.input("m", TensorType((256, 256), torch.bool)) if mask else None
    gb.output(gb.call("scaled_dot_product_attention", q, k, v, m, is_causal=causal))
    program = compile_graph(gb.build())
    return program, [n["detail"] for n in program.records()["evidence"]["nodes"]]


@pytest.mark.usefixtures("stax_cache")
def test_only_causal_float32_attention_without_mask_runs_in_row_blocks() -> None:
    _, details = _attention_graph(causal=True, mask=False, dtype=torch.float32)
    assert any("in blocks of" in d for d in details), details
    for causal, mask, dtype in [
        (False, False, torch.float32),
        (False, True, torch.float32),
        (True, False, torch.float64),
    ]:
        _, details = _attention_graph(causal, mask, dtype)
        assert not any("in blocks of" in d for d in details), (causal, mask, dtype, details)


class _CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(48, 3 * 48)
        self.proj = nn.Linear(48, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (h.view(b, t, 3, 16).transpose(1, 2) for h in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


@pytest.mark.usefixtures("stax_cache")
def test_symbolic_length_across_the_range_conforms() -> None:
    """One dynamic artifact called below, inside and above the row-block range."""
    torch.manual_seed(0)
    model = _CausalSelfAttention().eval()
    compiled = plait.compile(model, backend="stax", dynamic={"x": {1: "tokens"}})
    with torch.no_grad():
        for length in [64, 300, causal_attention.MAX_LEN + 30, 130]:

            def draw(seed: int, length: int = length) -> tuple[torch.Tensor]:
                gen = torch.Generator().manual_seed(seed)
                return (torch.randn(2, length, 48, generator=gen),)

            report = plait.conformance.check(model, compiled, draw, candidate_module=model)
            assert report.ok, (length, str(report))
    (spec,) = compiled._plait.specializations
    nodes = spec.compiled.manifest.executor["evidence"]["nodes"]
    assert any("in blocks of" in n["detail"] for n in nodes), nodes

"""A language-model head over a vocabulary that is not a multiple of 8, trained on CUDA under
bfloat16 autocast: its product runs on operands zero-padded as it runs
(``plait.codegen.cuda_padding``), both gradient products on one cotangent padded in the graph
(``plait.passes.pad_products``), and the step passes the gate (outputs and gradients). The
head's result, returned, is copied out of the CUDA graph once, into eager's contiguous layout
(``plait.runtime.cuda_graph_inputs``, ``plait.codegen.cuda_row_copy``). Skipped without CUDA."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import plait
from plait.codegen.cuda_row_copy import copy_rows
from plait.ir import Graph, GraphBuilder, TensorType
from plait.runtime import StaxOptions, compile_graph
from tests.autograd.test_training_autocast import gate_bf16_training
from tests.util import assert_bitwise, contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

VOCAB = 1001
TOL = contract_tol("matmul", torch.bfloat16)


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
    # NOTE: the head's result (its real columns) copied out of the graph once, contiguous
    assert executor["cuda_graph"].get("conformed_on_copy_out") == 1, executor["cuda_graph"]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = compiled(*_draw(7))
    assert logits.is_contiguous(), logits.stride()


def _head(rows: int, vocab: int, width: int) -> Graph:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((rows, width), torch.bfloat16, "cuda:0"))
    w = gb.input("w", TensorType((vocab, width), torch.bfloat16, "cuda:0"))
    gb.output(gb.call("linear", x, w))
    return gb.build()


@pytest.mark.parametrize("rows,vocab,width", [(64, VOCAB, 64), (4096, 50257, 768)])
def test_a_returned_padded_product_is_copied_out_once(rows: int, vocab: int, width: int) -> None:
    """The graphed program gives the uncaptured one's bits, laid out as it lays them out
    (contiguous: eager's layout), its real columns copied out of the graph by the row copy's
    kernel, not into the plan's layout inside the graph (no strided copy there)."""
    graphed = compile_graph(_head(rows, vocab, width))
    plain = compile_graph(_head(rows, vocab, width), options=StaxOptions(cuda_graphs=False))
    assert graphed.cuda_graph.get("conformed_on_copy_out") == 1, graphed.cuda_graph
    for seed in (0, 1):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(rows, width, device="cuda", generator=g).to(torch.bfloat16)
        w = torch.randn(vocab, width, device="cuda", generator=g).to(torch.bfloat16)
        (got,), (want,) = graphed(x, w), plain(x, w)
        assert got.is_contiguous() and want.is_contiguous()
        assert_bitwise(got, want, "graphed against uncaptured")
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w), **TOL)


def test_the_row_copy_matches_atens_copy_on_cuda() -> None:
    padded = torch.randn(8, 512, 50264, device="cuda").to(torch.bfloat16)
    padded.view(-1)[::9973] = float("nan")
    src = padded[..., :50257]
    got = torch.empty(src.shape, dtype=src.dtype, device="cuda")
    assert copy_rows(src, got)
    assert_bitwise(got, src.contiguous(), "row copy")

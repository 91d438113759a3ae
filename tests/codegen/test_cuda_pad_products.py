"""The ``pad-products`` pass (``plait.passes.pad_products``): 16-bit CUDA products with a
dimension not a multiple of 8 read zero-padded operands made once per source in the graph.
Judged on the CPU with the reference interpreter (the graphs retyped to CPU after the pass: the
rewrite's arithmetic is device-independent) against the graph before the pass, under the
numerical contract, by what the graphs hold (a vocabulary head's backward pads its cotangent
once for both gradient products), and compiled for the Triton target (interpreted). The CUDA
run: ``tests/gpu/test_cuda_padded_products.py``."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait.conformance
from plait.autograd import build_joint, partition
from plait.autograd.joint import prepare_for_autograd
from plait.codegen.options import StaxOptions
from plait.ir import Graph, GraphBuilder, TensorType, from_text, interpret, to_text
from plait.passes import TRAINING_PIPELINE, run_pipeline
from plait.passes.product_alignment import misaligned
from plait.runtime.program import compile_graph

BF16 = torch.bfloat16
CUDA = "cuda:0"


def _on_cpu(g: Graph, dtype: str) -> Graph:
    """``g`` retyped to CPU tensors of ``dtype`` (``f32``, ``f64``), by a text round trip."""
    text = to_text(g).replace("@cuda:0", "")
    return from_text(text.replace("bf16", dtype).replace("f32", dtype))


def _runner(g: Graph) -> Callable[..., list[Any]]:
    names = [v.name for v in g.inputs]
    return lambda *args: interpret(g, dict(zip(names, args)))


def _same_meaning(
    before: Graph, after: Graph, seed: int, candidate: Callable[..., list[Any]] | None = None
) -> None:
    """``after`` against ``before`` under the numerical contract (float32 on the CPU, anchored
    on a float64 run of ``before``), and special values where they were."""
    shapes = [tuple(int(d) for d in v.type.shape) for v in before.inputs]  # type: ignore[union-attr]

    def factory(k: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed * 100 + k)
        return tuple(torch.randn(s, generator=gen) for s in shapes)

    want64 = _runner(_on_cpu(before, "f64"))
    report = plait.conformance.check(
        _runner(_on_cpu(before, "f32")),
        candidate or _runner(_on_cpu(after, "f32")),
        factory,
        reference64=lambda *a: want64(*(t.double() for t in a)),
        stress=None,
    )
    assert report.ok, str(report)
    special = list(factory(99))
    for t in special:
        if t.dim() >= 2:
            t[0, 1], t[-1, 0] = float("inf"), float("nan")
    want = _runner(_on_cpu(before, "f32"))(*special)
    got = _runner(_on_cpu(after, "f32"))(*special)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.isinf(), w.isinf())


def _fired(g: Graph) -> tuple[Graph, int]:
    result = run_pipeline(g, "pad-products,dce")
    (record,) = [r for r in result.records if r.name == "pad-products"]
    return result.graph, len(record.rewrites)


def _head_backward(batch: tuple[int, ...], vocab: int, width: int) -> Graph:
    """A head's two gradient products as the partition writes them: ``dY @ W`` and
    ``reshape(dY)^T @ reshape(X)``, the latter read by a node (a tied weight's sum)."""
    gb = GraphBuilder()
    dy = gb.input("dy", TensorType((*batch, vocab), BF16, CUDA))
    w = gb.input("w", TensorType((vocab, width), BF16, CUDA))
    x = gb.input("x", TensorType((*batch, width), BF16, CUDA))
    rows = 1
    for n in batch:
        rows *= n
    flat = gb.call("reshape", dy, shape=[rows, vocab])
    dw = gb.call(
        "matmul", gb.call("permute", flat, dims=[1, 0]), gb.call("reshape", x, shape=[rows, width])
    )
    gb.output(gb.call("matmul", dy, w), gb.call("add", dw, w))
    return gb.build()


@pytest.mark.parametrize(
    "batch,vocab,width", [((4, 8), 1001, 64), ((16,), 13, 24), ((2, 3), 50, 8)]
)
def test_a_head_backward_pads_its_cotangent_once(
    batch: tuple[int, ...], vocab: int, width: int
) -> None:
    before = _head_backward(batch, vocab, width)
    after, fired = _fired(before)
    assert fired == 2
    pads = [n for n in after.nodes if n.op == "constant_pad"]
    dy = after.input("dy")
    assert sum(1 for n in pads if n.inputs[0] is dy) == 1, to_text(after)
    assert not any(misaligned(n) for n in after.nodes)
    _same_meaning(before, after, seed=vocab)


@pytest.mark.parametrize("k,n", [(13, 24), (16, 1001), (13, 1001)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_pads_k_and_n(k: int, n: int, bias: bool) -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3, 5, k), BF16, CUDA))
    w = gb.input("w", TensorType((n, k), BF16, CUDA))
    b = gb.input("b", TensorType((n,), BF16, CUDA)) if bias else None
    gb.output(gb.call("mul", gb.call("linear", x, w, b), 2.0))
    before = gb.build()
    after, fired = _fired(before)
    assert fired == 1
    assert not any(misaligned(node) for node in after.nodes)
    _same_meaning(before, after, seed=k + n)


def test_a_sliced_result_read_by_an_output_is_left_to_the_runtime() -> None:
    """The slice would be materialized and copied out again; the runtime returns a view."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 64), BF16, CUDA))
    w = gb.input("w", TensorType((1001, 64), BF16, CUDA))
    gb.output(gb.call("linear", x, w))
    after, fired = _fired(gb.build())
    assert fired == 0 and [n.op for n in after.nodes] == ["linear"]


def test_rows_of_a_row_major_operand_and_float32_stay() -> None:
    gb = GraphBuilder()
    a = gb.input("a", TensorType((1001, 64), BF16, CUDA))
    b = gb.input("b", TensorType((64, 64), BF16, CUDA))
    c = gb.input("c", TensorType((7, 13), torch.float32, CUDA))
    d = gb.input("d", TensorType((13, 5), torch.float32, CUDA))
    gb.output(gb.call("mul", gb.call("matmul", a, b), 2.0), gb.call("matmul", c, d))
    _, fired = _fired(gb.build())
    assert fired == 0


def test_a_vocabulary_heads_training_backward_shares_the_padded_cotangent() -> None:
    """The partition's backward of a tied head (the weight also read by a sum), after the
    training pipeline and the pass: one pad of the cotangent, no misaligned product left."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 32, 64), BF16, CUDA))
    w = gb.param("w", TensorType((1001, 64), BF16, CUDA))
    logits = gb.call("linear", x, w)
    gb.output(logits, gb.call("sum", gb.call("mul", w, w)))
    prepared = prepare_for_autograd(gb.build(), {"w", "x"})
    part = partition(build_joint(prepared, ["w", "x"], None), "min-cut")
    backward = run_pipeline(part.backward, TRAINING_PIPELINE).graph
    after = run_pipeline(backward, "pad-products,dce").graph
    cotangent = after.inputs[[v.name for v in after.inputs].index("cotangent_0")]
    pads = [n for n in after.nodes if n.op == "constant_pad" and n.inputs[0] is cotangent]
    assert len(pads) == 1, to_text(after)
    assert not any(misaligned(n) for n in after.nodes), to_text(after)
    _same_meaning(backward, after, seed=3)


def test_the_padded_backward_runs_as_triton_kernels() -> None:
    """The rewritten head backward compiled for the Triton target (interpreted on the CPU): the
    pad written by a kernel, the products reading it through views, the slice read by a
    kernel."""
    before = _head_backward((4, 8), 1001, 64)
    after, _ = _fired(before)
    program = compile_graph(_on_cpu(after, "f32"), options=StaxOptions(target="triton"))
    schedule = program.schedule()
    assert [s["op"] for s in schedule if s["kind"] == "extern"] == ["matmul", "matmul"]
    _same_meaning(before, after, seed=5, candidate=lambda *a: list(program(*a)))

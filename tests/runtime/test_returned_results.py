"""Extern results that only a CUDA program's return reads (``runner_emit.returned_only``): the
runner conforms them to the plan's strides, as every extern result, except while a CUDA graph
captures it (``Runner.returning_as_laid_out``), when it returns them as PyTorch laid them out
and the graphed call copies them out into the plan's strides (``cuda_graph_inputs``). Which
results those are is planned on the CPU (a CUDA-typed graph planned without dry runs); a result
that shares storage with an operand is always conformed. The CUDA run:
``tests/gpu/test_cuda_padded_products.py``."""

from __future__ import annotations

import torch

from plait.codegen.fusion import plan_graph
from plait.ir import Graph, GraphBuilder, TensorType
from plait.runtime.runner import Runner
from plait.runtime.runner_calls import returned
from plait.runtime.runner_emit import returned_only

BF16 = torch.bfloat16


def _heads(device: str) -> tuple[Graph, list[int]]:
    """Three products of one input: one only returned, one read by a kernel (and returned),
    one returned and viewed by another output."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 64), BF16, device))
    w = gb.input("w", TensorType((1001, 64), BF16, device))
    alone, read, viewed = (gb.call("linear", x, w) for _ in range(3))
    flipped = gb.call("transpose", viewed, dim0=0, dim1=1)
    gb.output(alone, read, gb.call("mul", read, 2.0), viewed, flipped)
    return gb.build(), [id(alone), id(read), id(viewed)]


def _plan(g: Graph, target: str) -> object:
    return plan_graph(g, infer_layouts=False, target=target, channels_last=False)


def test_only_results_nothing_else_reads_are_returned_raw() -> None:
    g, (alone, read, viewed) = _heads("cuda:0")
    found = returned_only(_plan(g, "triton"))  # type: ignore[arg-type]
    assert found == {alone: (1001, 1)} and read not in found and viewed not in found
    cpu, _ = _heads("cpu")
    assert returned_only(_plan(cpu, "cpu")) == {}  # type: ignore[arg-type]  # NOTE: no graph


def test_a_raw_result_is_conformed_unless_captured_or_shared() -> None:
    padded = torch.randn(4, 1008)
    view = padded[:, :1001]
    raw = [False]
    got = returned(view, (1001, 1), (torch.randn(4, 64),), raw)
    assert got.stride() == (1001, 1) and torch.equal(got, view)
    raw[0] = True
    assert returned(view, (1001, 1), (torch.randn(4, 64),), raw) is view
    shared = returned(view, (1001, 1), (padded,), raw)  # NOTE: a view of an operand
    assert shared.stride() == (1001, 1) and torch.equal(shared, view)
    assert shared.untyped_storage().data_ptr() != padded.untyped_storage().data_ptr()


def test_the_flag_is_raised_only_while_the_capture_runs() -> None:
    flag = [False]
    runner = Runner(lambda: [], "", None, None, {"_RAW": flag})
    with runner.returning_as_laid_out():
        assert flag == [True]
    assert flag == [False]
    try:
        with runner.returning_as_laid_out():
            raise RuntimeError("the capture failed")
    except RuntimeError:
        pass
    assert flag == [False]
    with Runner(lambda: [], "", None, None, {}).returning_as_laid_out():
        pass  # NOTE: a runner with no such result: nothing to raise

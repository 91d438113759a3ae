"""The Stax executor's contract with its caller: evidence, records, strictness, fallbacks, input
checks, output ownership, the memory plan, errors PyTorch raises, concurrency."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
import sympy
import torch

import plait.contract
from plait.codegen import CodegenError
from plait.ir import GraphBuilder, TensorType, interpret
from plait.runtime import StaxInputError, StaxOptions, compile_graph
from tests.util import assert_bitwise

pytestmark = pytest.mark.usefixtures("stax_cache")


def _opaque_graph():
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6), torch.float32))
    y = gb.call("opaque", [gb.call("relu", x)], target="torch.fliplr", out_types="f32[4, 6]")
    (y,) = y
    gb.output(gb.call("mul", y, 2.0))
    return gb.build()


def test_records_are_json_and_complete() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((16, 8), torch.float32))
    w = gb.input("w", TensorType((4, 8), torch.float32))
    gb.output(gb.call("softmax", gb.call("linear", gb.call("tanh", x), w), dim=-1))
    program = compile_graph(gb.build())
    rec = json.loads(json.dumps(program.records()))
    assert rec["backend"] == "stax"
    assert rec["evidence"]["counts"] == {"native": 2, "extern": 1, "fallback": 0, "dead": 0}
    assert {n["executor"] for n in rec["evidence"]["nodes"]} == {"native", "extern"}
    assert all(len(k["source_sha256"]) == 64 and k["nodes"] for k in rec["kernels"])
    assert [s["kind"] for s in rec["schedule"]] == ["kernel", "extern", "kernel"]
    assert rec["memory_plan"]["peak_live_bytes"] >= 16 * 8 * 4
    assert rec["toolchain"]["flags"] and rec["toolchain"]["cpu_flags"]


def test_strict_names_the_node_and_op() -> None:
    with pytest.raises(CodegenError) as err:
        compile_graph(_opaque_graph(), options=StaxOptions(strict=True))
    assert err.value.node_id == 1 and err.value.op == "opaque"
    assert "torch.fliplr" in str(err.value)


def test_fallback_is_recorded_and_runs() -> None:
    graph = _opaque_graph()
    program = compile_graph(graph)
    assert program.evidence.fallbacks == {1: "opaque call to torch.fliplr"}
    assert program.evidence.counts["fallback"] == 1
    x = torch.randn(4, 6)
    assert_bitwise(program(x)[0], interpret(graph, [x])[0])


def test_symbolic_dims_compile_on_the_cpu_and_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    gb = GraphBuilder()
    x = gb.input(
        "x", TensorType((sympy.Symbol("s0", integer=True, positive=True), 4), torch.float32)
    )
    gb.output(gb.call("relu", x))
    graph = gb.build()
    program = compile_graph(graph)
    for n in (2, 7):
        a = torch.randn(n, 4)
        assert_bitwise(program(a)[0], a.relu())
    from plait.codegen.fusion import check_graph

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    check_graph(graph, "triton")  # NOTE: Triton kernels take sizes too (tests/codegen)


def test_a_symbolic_size_below_the_guarded_two_is_refused() -> None:
    # NOTE: plait.compile specializes sizes 0 and 1, and kernels are proved in bounds for a
    # symbol of at least 2 (a piece of s0 - 1 rows is not empty): a direct call at 1 is refused
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((s0, 4), torch.float32))
    gb.output(gb.call("relu", x))
    program = compile_graph(gb.build())
    with pytest.raises(StaxInputError, match=re.escape("s0 = 1 (at least 2)")):
        program(torch.randn(1, 4))


def test_integer_division_by_zero_raises_like_pytorch() -> None:
    gb = GraphBuilder()
    a = gb.input("a", TensorType((5,), torch.int64))
    b = gb.input("b", TensorType((5,), torch.int64))
    gb.output(gb.call("div", a, b, rounding_mode="floor"))
    program = compile_graph(gb.build())
    b0 = torch.tensor([1, 2, 0, 3, 4])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        torch.div(torch.arange(5), b0, rounding_mode="floor")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        program(torch.arange(5), b0)


def test_inputs_are_checked() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6), torch.float32))
    gb.output(gb.call("exp", x))
    program = compile_graph(gb.build())
    with pytest.raises(StaxInputError, match="expected f32\\[4, 6\\]"):
        program(torch.randn(4, 7))
    with pytest.raises(StaxInputError, match="float64"):
        program(torch.randn(4, 6, dtype=torch.float64))
    with pytest.raises(StaxInputError, match="list"):
        program([1.0])
    program(torch.nn.Parameter(torch.randn(4, 6)))  # a Parameter is a tensor


def _const_graph(value: torch.Tensor):
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6), torch.float32))
    c = gb.input("c", TensorType((4, 6), torch.float32), kind="const")
    gb.output(gb.call("mul", gb.call("exp", x), c))
    graph = gb.build()
    graph.constants["c"] = value
    return graph


def test_constants_are_checked_once_when_the_program_is_built() -> None:
    """A graph constant is bound to the same tensor on every call: checked at build (a wrong
    one is refused there), not on every call; the user's inputs are checked on every call."""
    c = torch.randn(4, 6)
    graph = _const_graph(c)
    program = compile_graph(graph)
    assert "'x'" in program.source and "'c'" not in program.source  # NOTE: per call: x only
    x = torch.randn(4, 6)
    (y,) = program(x, c)
    torch.testing.assert_close(y, x.exp() * c)
    with pytest.raises(StaxInputError, match="expected f32\\[4, 6\\]"):
        program(torch.randn(4, 7), c)
    with pytest.raises(StaxInputError, match=re.escape("constant %c: torch.float64")):
        compile_graph(_const_graph(torch.randn(4, 6, dtype=torch.float64)))
    with pytest.raises(StaxInputError, match=re.escape("constant %c: torch.float32 (4, 5)")):
        compile_graph(_const_graph(torch.randn(4, 5)))


def test_a_non_contiguous_constant_reaches_a_kernel_dense() -> None:
    """A constant checked once at build still gets its layout conformed for a native kernel
    (a folded transpose is a strided view)."""
    c = torch.randn(6, 4).t()
    assert not c.is_contiguous()
    program = compile_graph(_const_graph(c))
    x = torch.randn(4, 6)
    (y,) = program(x, c)
    torch.testing.assert_close(y, x.exp() * c)


def test_outputs_are_fresh_and_inputs_pass_through() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((32, 32), torch.float32))
    h = gb.call("exp", x)
    gb.output(gb.call("amax", h, dims=(1,)), gb.call("sum", h, dims=(0,)), x)
    program = compile_graph(gb.build())
    a = torch.randn(32, 32)
    first = program(a)
    keep = [t.clone() for t in first]
    second = program(torch.randn(32, 32))
    assert first[2] is a
    for f, k, s in zip(first[:2], keep, second):
        assert f.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
        assert_bitwise(f, k)


def test_memory_plan_reuses_the_arena() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((64, 64), torch.float32))
    y = x
    for _ in range(6):  # each value is read by two reductions: materialized, then dead
        h = gb.call("exp", gb.call("tanh", y))
        y = gb.call(
            "add", gb.call("amax", h, dims=(1,), keepdim=True), gb.call("sum", h, dims=(0,))
        )
    gb.output(y)
    program = compile_graph(gb.build())
    plan = program.memory_plan
    arena = [b for b in plan.buffers if b.home == "arena"]
    assert len(arena) >= 6
    assert plan.arena_bytes < sum(b.nbytes for b in arena) / 2
    want = interpret(program.graph, [xs := torch.randn(64, 64)])[0]
    tol = plait.contract.load().tolerance("model", torch.float32)
    torch.testing.assert_close(program(xs)[0], want, rtol=tol.rtol, atol=tol.atol)


def test_concurrent_calls_are_serialized_and_correct() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((128, 128), torch.float32))
    h = gb.call("exp", gb.call("sin" if False else "tanh", x))
    gb.output(
        gb.call("sum", gb.call("mul", h, gb.call("amax", h, dims=(1,), keepdim=True)), dims=(1,))
    )
    program = compile_graph(gb.build())
    inputs = [torch.randn(128, 128) for _ in range(8)]
    expected = [program(t)[0] for t in inputs]
    got: list[torch.Tensor | None] = [None] * 8

    def work(i: int) -> None:
        for _ in range(5):
            got[i] = program(inputs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, e in zip(got, expected):
        assert g is not None
        assert_bitwise(g, e)


def test_second_compile_hits_the_cache(stax_cache: Path) -> None:
    graph = _opaque_graph()
    compile_graph(graph)
    again = compile_graph(graph)
    assert all(k.cache_hit for k in again.kernels)

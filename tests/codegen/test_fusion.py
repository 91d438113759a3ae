"""Fusion and lowering decisions, read from the plan and the kernel IR."""

from __future__ import annotations

import pytest
import torch

import plait
import plait.conformance
import plait.contract
from plait.codegen import plan_graph
from plait.codegen.cpp import print_kernel
from plait.codegen.kir import STORAGE_OF
from plait.codegen.loops import merge_loops
from plait.codegen.onednn_postops import mkl_linear_available
from plait.codegen.plan import ExternStep, KernelStep
from plait.ir import GraphBuilder, TensorType
from plait.ir.graph import Value


def chain(n: int = 10, shape: tuple[int, ...] = (64, 33)) -> GraphBuilder:
    gb = GraphBuilder()
    y = gb.input("x", TensorType(shape, torch.float32))
    ops = [("relu", ()), ("mul", (1.5,)), ("add", (0.5,)), ("sigmoid", ()), ("tanh", ())]
    for k in range(n):
        op, extra = ops[k % len(ops)]
        y = gb.call(op, y, *extra)
    gb.output(y)
    return gb


def test_pointwise_chain_is_one_flat_kernel() -> None:
    plan = plan_graph(chain().build())
    (low,) = plan.kernels
    assert low.kernel.nodes == tuple(range(10))
    assert [v.extent for v in merge_loops(low.kernel).outer] == [64 * 33]
    assert {t.executor for t in plan.tags.values()} == {"native"}


def test_broadcast_keeps_loops_and_hoists_invariants() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((8, 16), torch.float32))
    b = gb.input("b", TensorType((8, 1), torch.float32))
    gb.output(gb.call("mul", x, gb.call("exp", b)))
    (low,) = plan_graph(gb.build()).kernels
    assert len(merge_loops(low.kernel).outer) == 2
    src = print_kernel(low.kernel, "k")
    # exp(b) depends on the outer loop only: computed once per row, outside the simd loop
    assert src.index("expf(") < src.index("#pragma omp simd")


def test_expensive_shared_value_is_materialized_cheap_one_recomputed() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 4), torch.float32))
    cheap = gb.call("add", x, 1.0)
    costly = gb.call("exp", gb.call("tanh", x))
    gb.output(gb.call("amax", cheap, dims=(1,)), gb.call("sum", cheap, dims=(0,)),
              gb.call("amax", costly, dims=(1,)), gb.call("sum", costly, dims=(0,)))  # fmt: skip
    plan = plan_graph(gb.build())
    assert plan.locs[cheap].kind == "inline"
    assert plan.locs[costly].kind == "buffer"


def test_views_of_buffers_are_strided_no_copy() -> None:
    """linear -> view -> transpose -> attention: the extern gets a strided view, no kernel."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((1, 16, 24), torch.float32))
    w = gb.input("w", TensorType((24, 24), torch.float32))
    h = gb.call("linear", x, w)
    q = gb.call("transpose", gb.call("view", h, shape=(1, 16, 4, 6)), dim0=1, dim1=2)
    gb.output(gb.call("scaled_dot_product_attention", q, q, q, is_causal=True))
    plan = plan_graph(gb.build())
    assert [type(s) for s in plan.steps] == [ExternStep, ExternStep]
    assert plan.locs[q].kind == "view" and plan.locs[q].strides == (384, 6, 24, 1)


def test_reduction_templates_and_contract_accumulation() -> None:
    contract = plait.contract.load()
    names = {"float32": "f32", "float64": "f64", "int64": "i64"}
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32):
        gb = GraphBuilder()
        x = gb.input("x", TensorType((3, 5), dtype))
        gb.output(gb.call("sum", x, dims=(1,)))
        (low,) = plan_graph(gb.build()).kernels
        (reduce,) = low.kernel.phases[0].reduces
        want = contract.tolerance("reduction", dtype).accum_dtype
        assert reduce.dtype == names[want], dtype
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3, 5), torch.bfloat16))
    gb.output(gb.call("softmax", x, dim=-1))
    (low,) = plan_graph(gb.build()).kernels
    assert low.kernel.template == "softmax" and len(low.kernel.phases) == 3
    want = contract.tolerance("normalization", torch.bfloat16).accum_dtype
    assert {r.dtype for ph in low.kernel.phases for r in ph.reduces} == {names[want]}


def test_extern_epilogue_runs_in_place() -> None:
    from plait.runtime.memory import plan_memory

    gb = GraphBuilder()
    x = gb.input("x", TensorType((8, 32), torch.float32))
    w = gb.input("w", TensorType((16, 32), torch.float32))
    b = gb.input("b", TensorType((16,), torch.float32))
    y = gb.call("relu", gb.call("add", gb.call("linear", x, w), b))
    gb.output(gb.call("linear", y, gb.input("w2", TensorType((4, 16), torch.float32))))
    plan = plan_graph(gb.build())
    assert [type(s) for s in plan.steps] == [ExternStep, KernelStep, ExternStep]
    memory = plan_memory(plan)
    (epilogue,) = [b for b in memory.buffers if b.home == "inplace"]
    assert epilogue.value is y and epilogue.epilogue_of == 0


def test_kernel_text_is_readable() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4,), torch.bfloat16))
    gb.output(gb.call("mul", x, 2.0))
    (low,) = plan_graph(gb.build()).kernels
    assert low.kernel.text().splitlines() == [
        "kernel k0(in0: bf16[4], out out1: bf16[4]) over [i0<4]",
        "  t0 = load in0[i0]",
        "  t1 = f32(2.0)",
        "  t2 = mul(t0, t1): f32",
        "  t3 = round(t2) -> bf16: f32",
        "  phase 0: out1[i0] = t3",
    ]
    assert STORAGE_OF[torch.bfloat16] == "bf16"


def test_onednn_post_ops_fuse_activation_and_residual() -> None:
    """conv -> add(residual), conv -> tanh and linear -> gelu(tanh) run as one oneDNN call
    each (linears through oneDNN: ``mkl_linear=False``)."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((1, 8, 6, 6), torch.float32))
    w = gb.input("w", TensorType((8, 8, 3, 3), torch.float32), kind="const")
    y = gb.call("add", gb.call("conv2d", x, w, None, padding=(1, 1)), x)
    y = gb.call("tanh", gb.call("conv2d", y, w, None, padding=(1, 1)))
    h = gb.call("reshape", y, shape=(8, 36))
    lw = gb.input("lw", TensorType((16, 36), torch.float32))
    gb.output(gb.call("gelu", gb.call("linear", h, lw), approximate="tanh"))
    graph = gb.build()
    graph.constants["w"] = torch.randn(8, 8, 3, 3)
    plan = plan_graph(graph, mkl_linear=False)
    steps = [s for s in plan.steps if isinstance(s, ExternStep)]
    assert [(s.node.op, [n.op for n in s.fused]) for s in steps] == [
        ("conv2d", ["add"]),
        ("conv2d", ["tanh"]),
        ("linear", ["gelu"]),
    ]
    assert "prepacked at compile time" in plan.tags[0].detail
    fused = [t for t in plan.tags.values() if "oneDNN post-op" in t.detail]
    assert len(fused) == 3 and {t.executor for t in fused} == {"extern"}
    assert plan.exactness == {}


def test_inexact_onednn_post_ops_stay_native_with_the_reason_recorded() -> None:
    """relu (oneDNN's post-op maps NaN to 0) and linear's gelu(erf) are never post-ops: conv ->
    add -> relu fuses the add only, linear -> relu and linear -> gelu fuse nothing; each
    activation runs in a native kernel and the plan says why (linears through oneDNN)."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((1, 8, 6, 6), torch.float32))
    w = gb.input("w", TensorType((8, 8, 3, 3), torch.float32), kind="const")
    y = gb.call("relu", gb.call("add", gb.call("conv2d", x, w, None, padding=(1, 1)), x))
    h = gb.call("reshape", y, shape=(8, 36))
    lw = gb.input("lw", TensorType((16, 36), torch.float32))
    r = gb.call("relu", gb.call("linear", h, lw))
    gb.output(
        gb.call("gelu", gb.call("linear", r, gb.input("lw2", TensorType((4, 16), torch.float32))))
    )
    graph = gb.build()
    graph.constants["w"] = torch.randn(8, 8, 3, 3)
    plan = plan_graph(graph, mkl_linear=False)
    steps = [s for s in plan.steps if isinstance(s, ExternStep)]
    assert [(s.node.op, [n.op for n in s.fused]) for s in steps] == [
        ("conv2d", ["add"]),
        ("linear", []),
        ("linear", []),
    ]
    acts = [n for n in graph.nodes if n.op in ("relu", "gelu")]
    assert all(plan.tags[n.id].executor == "native" for n in acts)
    reasons = sorted(plan.exactness.values())
    assert len(reasons) == 3, reasons
    assert sum("relu" in r and "NaN" in r for r in reasons) == 2
    assert sum("gelu" in r for r in reasons) == 1
    for s in steps:
        assert plan.exactness[s.node.id] in plan.tags[s.node.id].detail


def test_an_mkl_linear_takes_no_post_op_and_its_activation_runs_native() -> None:
    """With MKL's packed GEMM (the default where the build has it), linear -> tanh is two steps:
    the linear, then tanh in a native kernel; and no exactness note (nothing was declined)."""
    if not mkl_linear_available():
        pytest.skip("this PyTorch build has no MKL packed linear")
    gb = GraphBuilder()
    # NOTE: more rows than plait's native kernel takes for a linear (MAX_LINEAR_ROWS)
    x = gb.input("x", TensorType((16, 36), torch.float32))
    lw = gb.input("lw", TensorType((16, 36), torch.float32), kind="const")
    lw2 = gb.input("lw2", TensorType((4, 16), torch.float32))
    t = gb.call("tanh", gb.call("linear", x, lw))
    gb.output(gb.call("relu", gb.call("linear", t, lw2)))
    graph = gb.build()
    graph.constants["lw"] = torch.randn(16, 36)
    plan = plan_graph(graph)
    steps = [s for s in plan.steps if isinstance(s, ExternStep)]
    assert [(s.node.op, [n.op for n in s.fused]) for s in steps] == [("linear", []), ("linear", [])]
    assert all(plan.tags[s.node.id].detail.startswith("MKL packed linear") for s in steps)
    acts = [n for n in graph.nodes if n.op in ("tanh", "relu")]
    assert all(plan.tags[n.id].executor == "native" for n in acts)
    assert plan.exactness == {}


def test_row_template_absorbs_its_pointwise_consumers() -> None:
    """layer_norm -> relu -> mul(x): one kernel, the normalized value never stored."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 8), torch.float32))
    ln = gb.call("layer_norm", x, None, None, normalized_shape=(8,))
    gb.output(gb.call("mul", gb.call("relu", ln), x))
    plan = plan_graph(gb.build())
    (low,) = plan.kernels
    assert low.kernel.template == "layer_norm" and low.kernel.nodes == (0, 1, 2)
    assert [b.output for b in low.kernel.buffers] == [False, True]
    assert plan.locs[ln].kind == "inline"


def _derivative_then_reshape(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """GELU(tanh)'s derivative times a gradient (a shared costly value), reshaped to the matrix
    a linear's backward multiplies: the pattern of a transformer MLP's backward."""
    t = torch.tanh(0.79788456 * (x + 0.044715 * x**3))
    shared = g * 0.5 * x * (1 - t * t) * 0.79788456
    d = shared + shared * 0.134145 * x * x + g * 0.5 * (1 + t)
    return d.reshape(-1, x.shape[-1]) @ w


def _derivative_graph() -> tuple[GraphBuilder, Value]:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((2, 16, 8), torch.float32))
    g = gb.input("g", TensorType((2, 16, 8), torch.float32))
    w = gb.input("w", TensorType((8, 4), torch.float32))
    t = gb.call("tanh", gb.call("mul", gb.call("add", x, gb.call("mul", gb.call("pow", x, 3.0),
                0.044715)), 0.79788456))  # fmt: skip
    shared = gb.call("mul", gb.call("mul", g, x), gb.call("sub", 1.0, gb.call("mul", t, t)))
    d = gb.call("add", gb.call("mul", shared, x), gb.call("mul", shared, gb.call("add", t, 1.0)))
    flat = gb.call("reshape", d, shape=(32, 8))
    gb.output(gb.call("matmul", flat, w), gb.call("sum", flat, dims=(0,)))
    return gb, flat


def test_a_reshape_read_by_an_extern_is_a_view_of_its_chains_kernel() -> None:
    """The chain and its reshape are one kernel: the reshape's input is materialized in the
    chain's shape and the reshape read as a contiguous view of it (codegen.view_base)."""
    gb, flat = _derivative_graph()
    graph = gb.build()
    plan = plan_graph(graph)
    kernels = [s.lowered.kernel for s in plan.steps if isinstance(s, KernelStep)]
    pointwise = [k.nodes for k in kernels if k.template == "pointwise"]
    assert len(pointwise) == 1, [(k.template, k.nodes) for k in kernels]
    loc = plan.locs[flat]
    assert (loc.kind, loc.offset, loc.strides) == ("view", 0, (8, 1)), loc


@pytest.mark.parametrize("target", ["cpu", "triton"])
def test_a_reshape_read_by_an_extern_matches_eager(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if target == "triton":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    compiled = plait.compile(_derivative_then_reshape, backend="stax",
                             options={"cache": False, "stax": {"target": target}})  # fmt: skip
    x, g, w = torch.randn(2, 16, 8), torch.randn(2, 16, 8), torch.randn(8, 4)
    report = plait.conformance.check(_derivative_then_reshape, compiled, (x, g, w))
    assert report.ok, str(report)
    program = compiled.specializations[0].compiled.program
    kernels = [k for k in program.kernels if "tanh" in k.source]
    assert len(kernels) == 1, [k.source for k in program.kernels]

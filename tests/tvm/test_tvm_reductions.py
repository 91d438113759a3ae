"""The TVM printer on views, data movement, reductions and normalizations (the Triton printer's
cases, ``tests/codegen/test_triton_printer.py``), compiled by Stax with TVM kernels and compared
with the reference interpreter; and every scalar op of the kernel IR printed in every type it
takes, without TVM imported."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest
import torch

from plait.codegen.index import Ix, Var
from plait.codegen.kir import SCALAR_OPS, KernelBuilder
from plait.codegen.tvm_script import Unsupported, print_tvm
from plait.ir import Graph, GraphBuilder, TensorType, interpret
from plait.runtime import compile_graph
from tests.tvm.test_tvm_printer import (
    BF16,
    BOOL,
    F16,
    F32,
    I16,
    I32,
    I64,
    TVM,
    U8,
    _ids,
    assert_like,
    check,
    draw,
    run_tvm,
)
from tests.util import assert_bitwise

pytestmark = pytest.mark.xdist_group("tvm-reductions")


# --- views, data movement, 0-d ------------------------------------------------------------------
def test_views_cat_pad_and_0_d() -> None:
    gen = torch.Generator().manual_seed(10)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6, 5), F32))
    y = gb.input("y", TensorType((6, 1), F32))
    a = gb.input("a", TensorType((3, 4), F32))
    b = gb.input("b", TensorType((3, 2), F32))
    c = gb.input("c", TensorType((1, 6), I32))
    s = gb.input("s", TensorType((), F32))
    p = gb.call("permute", x, dims=(2, 0, 1))
    sl = gb.call("slice", x, dim=1, start=1, end=6, step=2)
    cat = gb.call("cat", [a, b], dim=1)
    gb.output(
        gb.call("mul", p, 2.0),
        gb.call("sub", gb.call("expand", y, shape=(4, 6, 5)), x),
        gb.call("exp", gb.call("flip", x, dims=(0, 2))),
        gb.call("sub", gb.call("transpose", sl, dim0=1, dim1=2), 1.0),
        gb.call("mul", cat, 3.0),
        gb.call("add", gb.call("cat", [cat, gb.call("to_dtype", c, dtype=F32)], dim=0), 1.0),
        gb.call("neg", gb.call("constant_pad", a, pad=(2, 1, 1, 3), value=-0.5)),
        gb.call("add", gb.call("constant_pad", c, pad=(1, 2), value=9), 1),
        gb.call("exp", s),
        gb.call("sum", s),
    )
    inputs = [draw((4, 6, 5), F32, gen), draw((6, 1), F32, gen), draw((3, 4), F32, gen),
              draw((3, 2), F32, gen), draw((1, 6), I32, gen),
              draw((), F32, gen, specials=False)]  # fmt: skip
    check(gb.build(), inputs, "pointwise")


# --- reductions and normalizations --------------------------------------------------------------
def reductions(dtype: torch.dtype, shape: tuple[int, ...], dims: tuple[int, ...]) -> Graph:
    gb = GraphBuilder()
    x = gb.input("x", TensorType(shape, dtype))
    prod = x
    for d in sorted(dims, reverse=True):
        prod = gb.call("prod", prod, dims=(d,))
    gb.output(
        gb.call("sum", x, dims=dims),
        prod,
        gb.call("amax", x, dims=dims),
        gb.call("amin", x, dims=dims),
        gb.call("mean", x, dims=dims, keepdim=True),
    )
    return gb.build()


REDUCED = [((6, 9), (1,)), ((6, 32), (0,)), ((3, 4, 5), (0, 2)), ((7,), (0,)), ((4, 1, 48), (2,))]


@pytest.mark.parametrize("dtype", (F32, BF16), ids=_ids((F32, BF16)))
@pytest.mark.parametrize("case", REDUCED, ids=[f"{s}-{d}" for s, d in REDUCED])
def test_float_reductions(dtype: torch.dtype, case: tuple[Any, Any]) -> None:
    """sum/prod/mean within the reduction budget, amax/amin bitwise; rows with a NaN give NaN,
    a row of -inf its -inf."""
    shape, dims = case
    gen = torch.Generator().manual_seed(13)
    x = draw(shape, dtype, gen, (-1.5, 1.5), specials=False)
    x.view(-1)[1] = -0.0
    x.view(-1)[2] = math.nan
    x.view(-1)[-1] = -math.inf
    graph = reductions(dtype, shape, dims)
    got, want = run_tvm(graph, [x]), interpret(graph, [x])
    for name, g, w in zip(["sum", "prod", "amax", "amin", "mean"], got, want):
        assert_like(g, w, None if name in ("amax", "amin") else "reduction", name)


def test_max_and_min_of_infinite_rows() -> None:
    """Rows of only -inf (max) or +inf (min), rows holding the largest finite magnitudes: what
    the C++ kernels return (TVM's max reduction starts from the lowest finite value: the
    printer's flag restores the infinities)."""
    big = torch.finfo(F32).max
    x = torch.tensor(
        [[-math.inf] * 16, [math.inf] * 16, [-big] * 15 + [-math.inf], [big] + [math.inf] * 15]
    )
    gb = GraphBuilder()
    xv = gb.input("x", TensorType((4, 16), F32))
    gb.output(gb.call("amax", xv, dims=(1,)), gb.call("amin", xv, dims=(1,)))
    check(gb.build(), [x], None)


@pytest.mark.parametrize("dtype", (I64, I32, I16, U8, BOOL), ids=_ids((I64, I32, I16, U8, BOOL)))
def test_integer_reductions_are_bitwise(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(14)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((5, 33), dtype))
    outs = [gb.call("sum", x, dims=(1,)), gb.call("sum", x, dims=(0,)), gb.call("any", x)]
    outs += [gb.call("all", x, dims=(1,)), gb.call("count_nonzero", x, dims=(0,))]
    if dtype != BOOL:
        outs += [gb.call("prod", x, dims=(1,)), gb.call("amax", x, dims=(0,)),
                 gb.call("amin", x, dims=(1,))]  # fmt: skip
    gb.output(*outs)
    check(gb.build(), [draw((5, 33), dtype, gen)], None)


@pytest.mark.parametrize("dtype", (F32, F16), ids=_ids((F32, F16)))
def test_normalizations(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(15)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((6, 32), dtype))
    w = gb.input("w", TensorType((32,), dtype))
    bias = gb.input("bias", TensorType((32,), dtype))
    gb.output(
        gb.call("softmax", x, dim=1),
        gb.call("log_softmax", x, dim=0),
        gb.call("layer_norm", x, w, bias, normalized_shape=(32,)),
        gb.call("var", x, dims=(1,)),
        gb.call("var", x, dims=(0,), correction=0, keepdim=True),
        gb.call("logsumexp", x, dims=(1,)),
    )
    x_in = draw((6, 32), dtype, gen, specials=False)
    x_in[2, 3] = math.nan
    x_in[4, 1] = math.inf
    w_in, b_in = (draw((32,), dtype, gen, specials=False) for _ in range(2))
    inputs = [x_in, w_in, b_in]
    check(gb.build(), inputs, "normalization")


def test_long_rows_and_many_short_rows() -> None:
    """Rows of 5000 (vector partial sums over many chunks, NaN late in a row), rows of 3 (no
    vector lane divides them: sequential reductions), a parallel outer loop."""
    gen = torch.Generator().manual_seed(16)
    n = 5000
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3, n), F32))
    i = gb.input("i", TensorType((2, n), I32))
    s = gb.input("s", TensorType((300, 3), F32))
    big = gb.input("big", TensorType((512, 512), F32))
    gb.output(
        gb.call("softmax", x, dim=1),
        gb.call("amax", x, dims=(1,)),
        gb.call("sum", x, dims=(1,)),
        gb.call("var", x, dims=(1,)),
        gb.call("sum", i, dims=(1,)),
        gb.call("softmax", s, dim=1),
        gb.call("amin", s, dims=(1,)),
        gb.call("softmax", big, dim=1),
    )
    x_in = draw((3, n), F32, gen, specials=False)
    x_in[1, 4500] = math.nan
    s_in = draw((300, 3), F32, gen)
    s_in[s_in == 0] = 0.0  # NOTE: which of two zeros a min returns is its order's
    inputs = [x_in, draw((2, n), I32, gen), s_in, draw((512, 512), F32, gen, specials=False)]
    graph = gb.build()
    got, want = run_tvm(graph, inputs), interpret(graph, inputs)
    classes = ["normalization", None, "reduction", "reduction", None, "normalization", None,
               "normalization"]  # fmt: skip
    for k, (g, w, c) in enumerate(zip(got, want, classes)):
        assert_like(g, w, c, f"output {k}")
    assert got[1][1].isnan() and got[0][1].isnan().all()


def test_vector_lane_reductions_propagate_nan_and_infinities_in_one_pass() -> None:
    """Float32 max and min over rows that vector lanes divide are one pass of lanes (no NaN
    flag), combined pairwise: NaN anywhere in a row (the first or last element, a chunk's edge,
    with infinities, everywhere) gives NaN; rows of -inf or +inf, infinities among finite
    values and the largest finite magnitudes give what eager gives, bitwise. Softmax's sum of
    exp and its stores call libmvec (no scalar expf), within the contract."""
    from plait.codegen.build import cpu_info, toolchain
    from plait.codegen.tvm_vector import vector_isa

    if not toolchain().libmvec or vector_isa(cpu_info()[1]) is None:
        pytest.skip("no libmvec or no AVX2 here: vector blocks are not printed")
    gen = torch.Generator().manual_seed(19)
    rows, n = 16, 256
    x = draw((rows, n), F32, gen, specials=False)
    big = torch.finfo(F32).max
    x[1, 0] = x[2, n - 1] = x[9, 64] = x[10, 63] = math.nan
    x[3, 100], x[3, 5], x[3, 7] = math.nan, math.inf, -math.inf
    x[4], x[5] = -math.inf, math.inf
    x[6], x[6, 77] = -math.inf, -big
    x[7, 200], x[8, 3] = math.inf, -math.inf
    x[11] = math.nan
    x[12, 0::2], x[12, 1::2] = big, -big
    x[13, 17], x[13, 250] = math.inf, -math.inf
    gb = GraphBuilder()
    xv = gb.input("x", TensorType((rows, n), F32))
    gb.output(gb.call("amax", xv, dims=(1,)), gb.call("amin", xv, dims=(1,)))
    extrema = gb.build()
    program = compile_graph(extrema, options=TVM)
    assert all(k.printer == "tvm" and "_vector" in k.source and "_flag" not in k.source
               for k in program.kernels), [k.source for k in program.kernels]  # fmt: skip
    for name, g, w in zip(("amax", "amin"), program(x), interpret(extrema, [x])):
        assert_like(g, w, None, name)
        assert_bitwise(g.isnan(), getattr(torch, name)(x, dim=1).isnan(), name)
    gb = GraphBuilder()
    xv = gb.input("x", TensorType((rows, n), F32))
    gb.output(gb.call("softmax", xv, dim=1), gb.call("log_softmax", xv, dim=1))
    norms = gb.build()
    program = compile_graph(norms, options=TVM)
    assert all(k.printer == "tvm" and "_ZGV" in k.source and '"expf"' not in k.source
               for k in program.kernels), [k.source for k in program.kernels]  # fmt: skip
    finite = draw((rows, n), F32, gen, (-20.0, 20.0), specials=False)
    finite[3, 9], finite[5] = math.nan, -math.inf
    finite[6, 40] = math.inf
    for name, g, w in zip(("softmax", "log_softmax"), program(finite), interpret(norms, [finite])):
        assert_like(g, w, "normalization", name)
    # NOTE: no outer loop (one result), two reduced dimensions, a sum of exp beside a max
    gb = GraphBuilder()
    a, b = gb.input("a", TensorType((64,), F32)), gb.input("b", TensorType((2, 3, 32), F32))
    exp_b = gb.call("exp", b)
    gb.output(gb.call("amax", a, dims=(0,)), gb.call("softmax", a, dim=0),
              gb.call("amin", b, dims=(0, 2)), gb.call("sum", exp_b, dims=(2,)),
              gb.call("amax", exp_b, dims=(2,)))  # fmt: skip
    a_in, b_in = draw((64,), F32, gen, specials=False), draw((2, 3, 32), F32, gen, specials=False)
    a_in[5], b_in[0, 1, 7], b_in[1, 2, 31] = math.nan, math.nan, -math.inf
    got, want = run_tvm(gb.build(), [a_in, b_in]), interpret(gb.build(), [a_in, b_in])
    # NOTE: the max of exp is exp's (libmvec's) within the pointwise budget, not bitwise
    classes = [None, "normalization", None, "normalization", "pointwise"]
    for k, (g, w, c) in enumerate(zip(got, want, classes)):
        assert_like(g, w, c, f"output {k}")


def test_reduction_with_pointwise_prologue_and_epilogue() -> None:
    gen = torch.Generator().manual_seed(18)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((5, 12), BF16))
    b = gb.input("b", TensorType((12,), BF16))
    y = gb.call("tanh", gb.call("add", x, b))
    gb.output(gb.call("mul", gb.call("sum", y, dims=(1,), keepdim=True), 0.5))
    check(gb.build(), [draw((5, 12), BF16, gen, specials=False), draw((12,), BF16, gen)],
          "reduction")  # fmt: skip


# --- the printer alone --------------------------------------------------------------------------
def _print_op(op: str, t: str) -> str | None:
    """A kernel applying ``op`` in type ``t`` printed, or None where the op takes no ``t``."""
    floats_only = {"pow", "fdiv_trunc", "fdiv_floor", "exp", "log", "sqrt", "tanh", "erf", "sin",
                   "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                   "atanh", "expm1", "log1p", "log2", "log10", "exp2", "erfc", "atan2", "hypot",
                   "floor", "ceil", "trunc", "rint", "signbit", "fmod", "copysign", "fmax",
                   "fmin", "round", "div"}  # fmt: skip
    ints_only = {"idiv_trunc", "idiv_floor", "imod_trunc", "imod_floor", "ipow", "band", "bor",
                 "bxor", "bnot"}  # fmt: skip
    unary = {"neg", "abs", "not", "bnot", "exp", "log", "sqrt", "tanh", "erf", "sin", "cos",
             "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
             "expm1", "log1p", "log2", "log10", "exp2", "erfc", "floor", "ceil", "trunc",
             "rint"}  # fmt: skip
    float_t = t in ("f32", "f64")
    if (op in floats_only and not float_t) or (op in ints_only and (float_t or t == "b")):
        return None
    if op in ("and", "or", "not") and t != "b":
        return None
    b = KernelBuilder("k", outer=(Var("i0", 4),))
    x, y = b.buffer("x", t, 4), b.buffer("y", t, 4)
    i = Ix.var(b.outer[0])
    a, c = b.load(x, i), b.load(y, i)
    if op == "cast":
        v = b.cast(a, "i32" if float_t else "f32")
    elif op == "round":
        v = b.round(a, "bf16")
    elif op == "where":
        v = b.op("where", [b.op("lt", [a, c], "b"), a, c], t)
    elif op in ("eq", "ne", "lt", "le", "gt", "ge") or op == "signbit":
        v = b.op(op, [a, c] if op != "signbit" else [a], "b")
    elif op == "ipow":
        v = b.op(op, [a, b.const(5, t)], t)
    elif op in unary:
        v = b.op(op, [a], t)
    else:
        v = b.op(op, [a, c], t)
    out = b.buffer("out", v.dtype, 4, output=True)
    b.store(out, i, v)
    return print_tvm(b.build(nodes=()), "k").source


def test_every_scalar_op_prints_and_printing_needs_no_tvm() -> None:
    printed: set[str] = set()
    for t in ("f64", "f32", "i64", "i32", "i16", "i8", "u8", "b"):
        for op in sorted(SCALAR_OPS):
            if _print_op(op, t) is not None:
                printed.add(op)
    assert printed == SCALAR_OPS
    code = "import sys, plait.codegen.tvm_script; assert 'tvm' not in sys.modules, 'imported tvm'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_refusals_name_their_reason() -> None:
    """Symbolic sizes, empty loops and int32-overflowing indices are the C++ printer's."""
    from plait.symbolic.poly import from_dim

    b = KernelBuilder("k", outer=(Var("i0", 0),))
    x, y = b.buffer("x", "f32", 0), b.buffer("y", "f32", 0, output=True)
    b.store(y, Ix.var(b.outer[0]), b.load(x, Ix.var(b.outer[0])))
    with pytest.raises(Unsupported, match="empty loop"):
        print_tvm(b.build(nodes=()), "k")
    n = 3 << 30
    b = KernelBuilder("k", outer=(Var("i0", n),))
    x, y = b.buffer("x", "f32", n), b.buffer("y", "f32", n, output=True)
    b.store(y, Ix.var(b.outer[0]), b.load(x, Ix.var(b.outer[0])))
    with pytest.raises(Unsupported, match="int32"):
        print_tvm(b.build(nodes=()), "k")
    import sympy

    s = from_dim(sympy.Symbol("s0", positive=True, integer=True))
    b = KernelBuilder("k", outer=(Var("i0", s),))
    x, y = b.buffer("x", "f32", s), b.buffer("y", "f32", s, output=True)
    b.store(y, Ix.var(b.outer[0]), b.load(x, Ix.var(b.outer[0])))
    with pytest.raises(Unsupported, match="symbolic sizes"):
        print_tvm(b.build(nodes=()), "k")

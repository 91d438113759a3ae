"""The Triton printer: the kernels of Stax plans, printed for Triton and run by Triton's
interpreter on the CPU, against eager.

Each graph is planned (its plan must be kernels only), every kernel printed and launched in order
on tensors laid out as the plan says (outputs poisoned first), and the graph's outputs compared
with ``plait.ir.interpret`` on fresh random inputs (never zeros) with NaN, +-0 and +-inf written
in for the math. Exact ops (rounding, comparisons, selections, casts, integer arithmetic, max/min,
IEEE division and square root, 16-bit rounding, integer sums) must equal eager bitwise (a NaN may
have other payload bits); transcendentals are held to the contract's pointwise budget, float
reductions to its reduction or normalization budget, with NaN, infinities and signed zeros exact.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import plait.codegen.triton as triton_printer
import plait.contract
from plait.codegen.fusion import plan_graph
from plait.codegen.index import Ix, Var
from plait.codegen.kir import SCALAR_OPS, Kernel, KernelBuilder
from plait.codegen.plan import KernelStep
from plait.codegen.triton import print_triton
from plait.codegen.triton_blocks import reduction_blocks
from plait.codegen.triton_load import load_triton
from plait.codegen.views import shape_of
from plait.ir import Graph, GraphBuilder, TensorType, interpret
from plait.ir.graph import Value
from tests.util import assert_bitwise, ieee_sqrt

# NOTE: before Triton is imported: kernels decorated from here on run in its interpreter.
os.environ["TRITON_INTERPRET"] = "1"
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I64, I32, I16, I8 = torch.int64, torch.int32, torch.int16, torch.int8
U8, BOOL = torch.uint8, torch.bool
FLOATS = (F32, F64, BF16, F16)
INTS = (I64, I32, I16, I8, U8)
SPECIALS = (math.nan, 0.0, -0.0, math.inf, -math.inf)


@pytest.fixture(autouse=True)
def _private_cache(stax_cache: Path) -> None:
    """Kernel modules go to the session's cache, never the user's."""


# --- running a plan's kernels -------------------------------------------------------------------
def poison(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point:
        return math.nan
    return True if dtype == BOOL else 77


def run_triton(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The graph's outputs, computed by its plan's kernels printed for Triton."""
    plan = plan_graph(graph)
    tensors: dict[Value, torch.Tensor] = {}
    for v, x in zip(graph.inputs, inputs):
        tensors[v] = torch.empty_strided(x.shape, plan.locs[v].strides, dtype=x.dtype).copy_(x)
    for k, step in enumerate(plan.steps):
        assert isinstance(step, KernelStep), f"not a kernel: {step}"
        kernel = step.lowered.kernel
        args = []
        for v, buf in zip(step.lowered.bindings, kernel.buffers):
            if buf.output:
                assert isinstance(v.type, TensorType)
                shape, strides = shape_of(v.type), plan.locs[v].strides
                out = torch.empty_strided(shape, strides, dtype=v.type.dtype)
                tensors[v] = out.fill_(poison(v.type.dtype))
            args.append(tensors[v])
        load_triton(print_triton(kernel, f"kernel{k}"))(*args)
    results = []
    for o in graph.outputs:
        assert isinstance(o, Value) and isinstance(o.type, TensorType)
        loc = plan.locs[o]
        if loc.kind == "view":
            assert loc.base is not None
            base = tensors[loc.base]
            results.append(torch.as_strided(base, shape_of(o.type), loc.strides, loc.offset))
        else:
            results.append(tensors[o])
    return results


# --- comparing with eager -----------------------------------------------------------------------
def _nan_canonical(t: torch.Tensor) -> torch.Tensor:
    if not t.is_floating_point():
        return t
    return torch.where(t.isnan(), torch.full_like(t, math.nan), t)


def assert_like(got: torch.Tensor, want: torch.Tensor, op_class: str | None, what: str) -> None:
    """``op_class`` None: bitwise (NaNs equal whatever their payload); else within the contract's
    budget for the class: ``|got - want| <= atol * max(1, S) + rtol * |want|`` (S the largest
    finite magnitude of ``want``; pointwise: S = 1), NaN, infinities and zeros exactly."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if op_class is None or not want.is_floating_point():
        assert_bitwise(_nan_canonical(got.contiguous()), _nan_canonical(want.contiguous()), what)
        return
    tol = plait.contract.load().tolerance(op_class, want.dtype)
    g, w = got.double(), want.double()
    finite = w[w.isfinite()]
    scale = 1.0 if op_class == "pointwise" or finite.numel() == 0 else max(1.0, finite.abs().max())
    special = w.isinf() | (w == 0)
    same = (g == w) & (torch.signbit(g) == torch.signbit(w))
    close = w.isfinite() & ((g - w).abs() <= tol.atol * scale + tol.rtol * w.abs())
    ok = (g.isnan() & w.isnan()) | torch.where(special, same, close & ~g.isnan())
    if not bool(ok.all()):
        at = tuple((~ok).nonzero()[0].tolist())
        raise AssertionError(f"{what}: at {at}: got {float(g[at])!r}, eager {float(w[at])!r}")


def check(
    graph: Graph, inputs: Sequence[torch.Tensor], op_class: str | None, names: Sequence[str] = ()
) -> None:
    got = run_triton(graph, inputs)
    want = interpret(graph, list(inputs))
    for k, (g, w) in enumerate(zip(got, want)):
        what = names[k] if k < len(names) else f"output {k}"
        assert_like(g, w, op_class, what)


# --- inputs -------------------------------------------------------------------------------------
def draw(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    gen: torch.Generator,
    domain: tuple[float, float] = (-4.0, 4.0),
    specials: bool = True,
    divisor: bool = False,
) -> torch.Tensor:
    """Fresh random values: floats in ``domain`` (with specials written in); integers of both
    signs (``divisor``: nonzero); bools."""
    if dtype == BOOL:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        lo, hi = (1, 9) if divisor else ((0, 60) if dtype == U8 else (-60, 60))
        t = torch.randint(lo, hi, shape, generator=gen)
        if divisor and dtype != U8:
            t = t * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)
        return t.to(dtype)
    lo, hi = domain
    u = torch.rand(shape, generator=gen, dtype=F64)
    t = (lo + (hi - lo) * u).to(dtype)
    if specials and t.numel():
        flat = t.view(-1)
        where = torch.randperm(flat.numel(), generator=gen)[: max(1, flat.numel() // 3)]
        for k, pos in enumerate(where.tolist()):
            flat[pos] = SPECIALS[k % len(SPECIALS)]
    return t


def one_op_each(
    ops: Sequence[tuple[str, dict[str, Any]]], dtype: torch.dtype, shape: tuple[int, ...]
) -> Graph:
    """One input per op, each op's result a graph output."""
    gb = GraphBuilder()
    outs = []
    for k, (op, attrs) in enumerate(ops):
        x = gb.input(f"x{k}", TensorType(shape, dtype))
        outs.append(gb.call(op, x, **attrs))
    gb.output(*outs)
    return gb.build()


def _ids(dtypes: Sequence[torch.dtype]) -> list[str]:
    return [str(d).removeprefix("torch.") for d in dtypes]


# --- pointwise math -----------------------------------------------------------------------------
# (op, domain): libdevice's functions through the numpy shim, within the pointwise budget.
TRANSCENDENTAL = [
    ("exp", (-4.0, 4.0)), ("log", (0.05, 6.0)), ("tanh", (-4.0, 4.0)), ("erf", (-3.0, 3.0)),
    ("sin", (-3.0, 3.0)), ("cos", (-3.0, 3.0)), ("tan", (-1.5, 1.5)), ("asin", (-1.0, 1.0)),
    ("acos", (-1.0, 1.0)), ("atan", (-3.0, 3.0)), ("sinh", (-3.0, 3.0)), ("cosh", (-3.0, 3.0)),
    ("asinh", (-3.0, 3.0)), ("acosh", (1.0, 6.0)), ("atanh", (-0.99, 0.99)),
    ("expm1", (-3.0, 3.0)), ("log1p", (-0.95, 4.0)), ("log2", (0.05, 6.0)),
    ("log10", (0.05, 6.0)), ("exp2", (-3.0, 3.0)), ("erfc", (-3.0, 3.0)),
    ("sigmoid", (-6.0, 6.0)), ("silu", (-6.0, 6.0)),
    ("mish", (-6.0, 6.0)), ("logsigmoid", (-6.0, 6.0)), ("softplus", (-6.0, 6.0)),
    ("elu", (-6.0, 6.0)), ("rsqrt", (0.05, 6.0)),
]  # fmt: skip
# Exact float ops: rounding, signs, predicates, IEEE division, selections (sqrt: its own test).
EXACT_UNARY: list[tuple[str, dict[str, Any]]] = [
    ("floor", {}), ("ceil", {}), ("trunc", {}), ("round", {}), ("round", {"decimals": 2}),
    ("round", {"decimals": -1}), ("frac", {}), ("sign", {}), ("signbit", {}), ("isnan", {}),
    ("isinf", {}), ("isfinite", {}), ("isposinf", {}), ("isneginf", {}), ("neg", {}),
    ("abs", {}), ("relu", {}), ("nan_to_num", {}), ("reciprocal", {}),
    ("hardsigmoid", {}), ("hardswish", {}), ("leaky_relu", {}), ("hardshrink", {}),
    ("threshold", {"threshold": 0.1, "value": 20.0}), ("clamp", {"min": -1.5, "max": 2.0}),
    ("logical_not", {}), ("to_dtype", {"dtype": F64}), ("to_dtype", {"dtype": F16}),
    ("to_dtype", {"dtype": BF16}), ("to_dtype", {"dtype": BOOL}),
]  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_transcendentals(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    graph = one_op_each([(op, {}) for op, _ in TRANSCENDENTAL], dtype, (5, 7))
    inputs = [draw((5, 7), dtype, gen, domain) for _, domain in TRANSCENDENTAL]
    check(graph, inputs, "pointwise", [op for op, _ in TRANSCENDENTAL])


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_gelu(dtype: torch.dtype) -> None:
    """Without infinities: the lowering decides gelu(+inf) by whether eager runs oneDNN, which
    this PyTorch also does for float16 (NaN) where the lowering expects ATen's +inf."""
    gen = torch.Generator().manual_seed(21)
    ops: list[tuple[str, dict[str, Any]]] = [("gelu", {}), ("gelu", {"approximate": "tanh"})]
    inputs = [draw((5, 7), dtype, gen, specials=False) for _ in ops]
    for x in inputs:
        x[0, :4] = torch.tensor([math.nan, 0.0, -0.0, -math.inf])
    check(one_op_each(ops, dtype, (5, 7)), inputs, "pointwise", ["gelu", "gelu tanh"])


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_exact_unary_float_ops_are_bitwise(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    graph = one_op_each(EXACT_UNARY, dtype, (6, 5))
    inputs = [draw((6, 5), dtype, gen, (-300.0, 300.0) if "decimals" in a else (-4.0, 4.0))
              for _, a in EXACT_UNARY]  # fmt: skip
    check(graph, inputs, None, [op for op, _ in EXACT_UNARY])


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_sqrt_is_correctly_rounded(dtype: torch.dtype) -> None:
    """The IEEE root bitwise; eager's within the pointwise budget, since eager's CPU sqrt (MKL's
    vector math where PyTorch links MKL) is within 1 ulp of it but not always on it."""
    gen = torch.Generator().manual_seed(3)
    graph = one_op_each([("sqrt", {})], dtype, (16, 32))
    x = draw((16, 32), dtype, gen, (-1.0, 8.0))
    (got,) = run_triton(graph, [x])
    assert_bitwise(_nan_canonical(got.contiguous()), _nan_canonical(ieee_sqrt(x)), "sqrt")
    check(graph, [x], "pointwise", ["sqrt"])


EXACT_BINARY = ["add", "sub", "mul", "div", "div_trunc", "div_floor", "maximum", "minimum",
                "fmax", "fmin", "copysign", "eq", "ne", "lt", "le", "gt", "ge", "logical_xor",
                "logical_and", "logical_or"]  # fmt: skip
INEXACT_BINARY = ["atan2", "hypot", "pow", "xlogy"]
BROADCASTS = [((5, 7), (5, 7)), ((3, 1, 6), (6,)), ((), (4,)), ((2, 3), ())]


def binary_graph(
    ops: Sequence[str], da: torch.dtype, db: torch.dtype, sa: tuple[int, ...], sb: tuple[int, ...]
) -> Graph:
    gb = GraphBuilder()
    outs = []
    for k, op in enumerate(ops):
        a = gb.input(f"a{k}", TensorType(sa, da))
        b = gb.input(f"b{k}", TensorType(sb, db))
        if op.startswith("div_"):
            outs.append(gb.call("div", a, b, rounding_mode=op.removeprefix("div_")))
        else:
            outs.append(gb.call(op, a, b))
    gb.output(*outs)
    return gb.build()


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
@pytest.mark.parametrize("shapes", BROADCASTS, ids=[f"{a}x{b}" for a, b in BROADCASTS])
def test_binary_float_ops(dtype: torch.dtype, shapes: tuple[Any, Any]) -> None:
    gen = torch.Generator().manual_seed(3)
    sa, sb = shapes
    for ops, op_class in ((EXACT_BINARY, None), (INEXACT_BINARY, "pointwise")):
        graph = binary_graph(ops, dtype, dtype, sa, sb)
        inputs = [draw(s, dtype, gen, (0.0, 4.0) if op == "xlogy" else (-4.0, 4.0))
                  for op in ops for s in (sa, sb)]  # fmt: skip
        check(graph, inputs, op_class, ops)


@pytest.mark.parametrize("dtype", (BF16, F16), ids=_ids((BF16, F16)))
def test_16_bit_chains_round_every_intermediate(dtype: torch.dtype) -> None:
    """A fused chain rounds each intermediate to its 16-bit dtype, as eager stores it. (No
    division, no Python scalars: this PyTorch's float16 division and its float16 ``x + 0.1``
    differ from the lowering's float32 opmath by an ulp at some positions, in the C++ kernels
    alike.)"""
    gen = torch.Generator().manual_seed(22)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((8, 8), dtype))
    y = gb.input("y", TensorType((8, 8), dtype))
    s = gb.call("add", x, y)
    gb.output(gb.call("mul", gb.call("sub", gb.call("mul", s, s), x), y),
              gb.call("mul", s, gb.call("sub", y, gb.call("neg", x))))  # fmt: skip
    check(gb.build(), [draw((8, 8), dtype, gen), draw((8, 8), dtype, gen)], None)


def test_signed_zero_ties_follow_the_cpp_printer() -> None:
    """max/min give the second of two equal values, fmax/fmin the first (the C++ prelude)."""
    b = KernelBuilder("ties", outer=(Var("i0", 4),))
    x, y = b.buffer("x", "f32", 4), b.buffer("y", "f32", 4)
    i = Ix.var(b.outer[0])
    a, c = b.load(x, i), b.load(y, i)
    outs = [b.buffer(op, "f32", 4, output=True) for op in ("max", "min", "fmax", "fmin")]
    for out, op in zip(outs, ("max", "min", "fmax", "fmin")):
        b.store(out, i, b.op(op, [a, c], "f32"))
    xs = torch.tensor([0.0, -0.0, math.nan, 1.0])
    ys = torch.tensor([-0.0, 0.0, 2.0, math.nan])
    got = [torch.empty(4) for _ in outs]
    load_triton(print_triton(b.build(nodes=()), "ties"))(xs, ys, *got)
    second = torch.tensor([-0.0, 0.0, math.nan, math.nan])
    first = torch.tensor([0.0, -0.0, 2.0, 1.0])
    for op, g, want in zip(("max", "min", "fmax", "fmin"), got, (second, second, first, first)):
        assert_like(g, want, None, op)


def test_mixed_dtypes_and_python_scalars_promote_as_eager() -> None:
    gen = torch.Generator().manual_seed(4)
    gb = GraphBuilder()
    a = gb.input("a", TensorType((4, 5), F16))
    b = gb.input("b", TensorType((5,), F64))
    i = gb.input("i", TensorType((4, 5), I32))
    u = gb.input("u", TensorType((4, 5), U8))
    outs = [
        gb.call("add", a, b),
        gb.call("mul", i, 2.5),
        gb.call("sub", u, 3),
        gb.call("add", i, u),
        gb.call("mul", a, i),
        gb.call("pow", a, 2),
        gb.call("pow", a, 0.5),
        gb.call("pow", b, -1),
        gb.call("lt", i, 0.5),
        gb.call("where", gb.call("gt", a, 0.0), i, -7),
    ]
    gb.output(*outs)
    inputs = [draw((4, 5), F16, gen), draw((5,), F64, gen), draw((4, 5), I32, gen),
              draw((4, 5), U8, gen)]  # fmt: skip
    check(gb.build(), inputs, None)


# --- integers and bools -------------------------------------------------------------------------
INT_BINARY = ["add", "sub", "mul", "maximum", "minimum", "fmax", "fmin", "bitwise_and",
              "bitwise_or", "bitwise_xor", "eq", "ne", "lt", "le", "gt", "ge", "pow"]  # fmt: skip
INT_DIVISION = ["div_trunc", "div_floor", "remainder", "fmod"]


@pytest.mark.parametrize("dtype", INTS, ids=_ids(INTS))
def test_integer_ops_are_bitwise(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    shape = (3, 1, 6)
    graph = binary_graph(INT_BINARY, dtype, dtype, shape, (6,))
    check(graph, [draw(s, dtype, gen) for _ in INT_BINARY for s in (shape, (6,))], None, INT_BINARY)
    graph = binary_graph(INT_DIVISION, dtype, dtype, shape, (6,))
    inputs = [draw(s, dtype, gen, divisor=k == 1) for _ in INT_DIVISION
              for k, s in enumerate((shape, (6,)))]  # fmt: skip
    check(graph, inputs, None, INT_DIVISION)
    unary = [("abs", {}), ("bitwise_not", {}), ("sign", {}), ("signbit", {}), ("floor", {}),
             ("relu", {}), ("to_dtype", {"dtype": F32}), ("to_dtype", {"dtype": I8}),
             ("to_dtype", {"dtype": BOOL}), ("sqrt", {}), ("exp", {})]  # fmt: skip
    if dtype != U8:
        unary.append(("neg", {}))
    graph = one_op_each(unary, dtype, (4, 6))
    check(graph, [draw((4, 6), dtype, gen) for _ in unary], "pointwise", [o for o, _ in unary])


def test_integer_wraparound_and_extremes() -> None:
    """Wrapping products and sums, INT_MIN / -1 and % -1, powers that overflow."""
    gen = torch.Generator().manual_seed(6)
    for dtype in (I64, I32, I16, I8):
        info = torch.iinfo(dtype)
        a = torch.tensor([info.min, info.max, info.min, -7, 7, info.max, -1, 0], dtype=dtype)
        b = torch.tensor([2, -1, 3, 2, -2, 2, -1, 5], dtype=dtype)
        ops = ["mul", "add", "div_trunc", "div_floor", "remainder", "fmod", "sub"]
        check(binary_graph(ops, dtype, dtype, (8,), (8,)), [a, b] * len(ops), None, ops)
        # NOTE: eager's INT_MIN / -1 traps on x86 (SIGFPE): the C++ printer's results instead,
        # -INT_MIN wrapping to INT_MIN and a zero remainder.
        ops = ops[2:6]
        a, b = a[:1], torch.tensor([-1], dtype=dtype)
        got = run_triton(binary_graph(ops, dtype, dtype, (1,), (1,)), [a, b] * len(ops))
        for op, g, want in zip(ops, got, (a, a, a * 0, a * 0)):
            assert_bitwise(g, want, f"{op}(INT_MIN, -1)")
        e = torch.randint(0, 40, (8,), generator=gen).to(dtype)
        e[0] = -1
        e[1] = -2
        x = torch.tensor([3, -3, -1, 1, 2, 0, 7, -2], dtype=dtype)
        check(binary_graph(["pow"], dtype, dtype, (8,), (8,)), [x, e], None, ["pow"])


def test_bool_ops_are_bitwise() -> None:
    gen = torch.Generator().manual_seed(7)
    ops = ["logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
           "bitwise_xor", "eq", "ne", "maximum", "minimum", "add", "mul"]  # fmt: skip
    graph = binary_graph(ops, BOOL, BOOL, (5, 4), (4,))
    check(graph, [draw(s, BOOL, gen) for _ in ops for s in ((5, 4), (4,))], None, ops)
    unary = [("logical_not", {}), ("bitwise_not", {}), ("to_dtype", {"dtype": F32}),
             ("to_dtype", {"dtype": I64}), ("to_dtype", {"dtype": U8})]  # fmt: skip
    check(one_op_each(unary, BOOL, (7,)), [draw((7,), BOOL, gen) for _ in unary], None)
    gb = GraphBuilder()
    c = gb.input("c", TensorType((3, 4), BOOL))
    a = gb.input("a", TensorType((3, 4), BF16))
    gb.output(
        gb.call("where", c, a, -0.0), gb.call("where", c, gb.call("to_dtype", c, dtype=I64), 3)
    )
    check(gb.build(), [draw((3, 4), BOOL, gen), draw((3, 4), BF16, gen)], None)


def test_float_to_integer_casts_truncate() -> None:
    gen = torch.Generator().manual_seed(8)
    for src in (F32, F64, BF16, F16):
        targets = [I64, I32, I16, I8, U8]
        ops = [("to_dtype", {"dtype": t}) for t in targets]
        graph = one_op_each(ops, src, (9,))
        inputs = []
        for t in targets:
            lo = 0.0 if t == U8 else -100.0
            inputs.append(draw((9,), src, gen, (lo, 100.0), specials=False))
        check(graph, inputs, None, _ids(targets))


def test_float_rounding_of_wider_values() -> None:
    """float64 -> float32 / 16-bit (round to nearest even, overflow to infinity, subnormals)."""
    x = torch.tensor(
        [1 + 2**-24, 1 + 3 * 2**-24, 1e39, -1e39, 1e-40, 2**-149 * 0.5, 65520.0, 1 + 2**-8,
         1 + 3 * 2**-9, 3.0e38, -0.0, math.nan, 1e-8, -65504.0],
        dtype=F64,
    )  # fmt: skip
    ops = [("to_dtype", {"dtype": t}) for t in (F32, F16, BF16)]
    check(one_op_each(ops, F64, (14,)), [x, x, x], None)


def test_direct_kernel_fmod_and_every_scalar_op_prints() -> None:
    """Float ``fmod`` (an ATen extern in CPU plans) run from a kernel built by hand; and every
    scalar op of the IR printed in every scalar type it takes."""
    gen = torch.Generator().manual_seed(9)
    for t, dtype in (("f32", F32), ("f64", F64)):
        b = KernelBuilder("fmod", outer=(Var("i0", 16),))
        x, y = b.buffer("x", t, 16), b.buffer("y", t, 16)
        out = b.buffer("out", t, 16, output=True)
        i = Ix.var(b.outer[0])
        b.store(out, i, b.op("fmod", [b.load(x, i), b.load(y, i)], t))
        xs, ys = draw((16,), dtype, gen), draw((16,), dtype, gen, (-3.0, 3.0))
        got = torch.full((16,), math.nan, dtype=dtype)
        load_triton(print_triton(b.build(nodes=()), "fmod"))(xs, ys, got)
        assert_like(got, torch.fmod(xs, ys), None, f"fmod {t}")
    printed: set[str] = set()
    for t in ("f64", "f32", "i64", "i32", "i16", "i8", "u8", "b"):
        for op in sorted(SCALAR_OPS):
            source = _print_op(op, t)
            if source is not None:
                printed.add(op)
    assert printed == SCALAR_OPS


UNARY_SCALAR_OPS = {"neg", "abs", "not", "bnot"} | (
    set(triton_printer.LIBDEVICE) - {"atan2", "hypot", "pow", "fmod", "copysign"}
)


def _print_op(op: str, t: str) -> str | None:
    """A kernel applying ``op`` in type ``t`` printed, or None where the op takes no ``t``."""
    floats_only = {"pow", "fdiv_trunc", "fdiv_floor", "exp", "log", "sqrt", "tanh", "erf", "sin",
                   "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                   "atanh", "expm1", "log1p", "log2", "log10", "exp2", "erfc", "atan2", "hypot",
                   "floor", "ceil", "trunc", "rint", "signbit", "fmod", "copysign", "fmax",
                   "fmin", "round", "div"}  # fmt: skip
    ints_only = {"idiv_trunc", "idiv_floor", "imod_trunc", "imod_floor", "ipow", "band", "bor",
                 "bxor", "bnot"}  # fmt: skip
    bool_only = {"and", "or", "not"}
    float_t = t in ("f32", "f64")
    if (op in floats_only and not float_t) or (op in ints_only and (float_t or t == "b")):
        return None
    if op in bool_only and t != "b":
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
    elif op in UNARY_SCALAR_OPS:
        v = b.op(op, [a], t)
    else:
        v = b.op(op, [a, c], t)
    out = b.buffer("out", v.dtype, 4, output=True)
    b.store(out, i, v)
    return print_triton(b.build(nodes=()), "k").source


# --- views, data movement, 0-d and empty --------------------------------------------------------
def test_views_permute_slice_expand_flip() -> None:
    gen = torch.Generator().manual_seed(10)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6, 5), F32))
    y = gb.input("y", TensorType((6, 1), F32))
    p = gb.call("permute", x, dims=(2, 0, 1))
    s = gb.call("slice", x, dim=1, start=1, end=6, step=2)
    e = gb.call("expand", y, shape=(4, 6, 5))
    f = gb.call("flip", x, dims=(0, 2))
    q = gb.call("permute", s, dims=(0, 2, 1))
    gb.output(
        gb.call("mul", p, 2.0),
        gb.call("add", s, 1.0),
        gb.call("sub", e, x),
        gb.call("exp", f),
        gb.call("sub", gb.call("transpose", s, dim0=1, dim1=2), gb.call("flip", q, dims=(0, 1))),
    )
    check(gb.build(), [draw((4, 6, 5), F32, gen), draw((6, 1), F32, gen)], "pointwise")


def test_cat_and_pad_clamp_their_indices() -> None:
    gen = torch.Generator().manual_seed(11)
    gb = GraphBuilder()
    a = gb.input("a", TensorType((3, 4), F32))
    b = gb.input("b", TensorType((3, 2), F32))
    c = gb.input("c", TensorType((1, 6), I32))
    cat = gb.call("cat", [a, b], dim=1)
    gb.output(
        gb.call("mul", cat, 3.0),
        gb.call("add", gb.call("cat", [cat, gb.call("to_dtype", c, dtype=F32)], dim=0), 1.0),
        gb.call("neg", gb.call("constant_pad", a, pad=(2, 1, 1, 3), value=-0.5)),
        gb.call("add", gb.call("constant_pad", c, pad=(1, 2), value=9), 1),
        gb.call("abs", gb.call("constant_pad", a, pad=(-1, 2))),
    )
    inputs = [draw((3, 4), F32, gen), draw((3, 2), F32, gen), draw((1, 6), I32, gen)]
    check(gb.build(), inputs, None)


def test_zero_dim_and_empty_tensors() -> None:
    gen = torch.Generator().manual_seed(12)
    gb = GraphBuilder()
    s = gb.input("s", TensorType((), F32))
    e = gb.input("e", TensorType((0, 3), F32))
    r = gb.input("r", TensorType((4, 0), I64))
    gb.output(
        gb.call("exp", s),
        gb.call("mul", e, s),
        gb.call("sum", e, dims=(0,)),
        gb.call("amax", e, dims=(1,)),
        gb.call("sum", r, dims=(1,)),
        gb.call("prod", r, dims=(1,)),
        gb.call("sum", s),
        gb.call("add", r, 1),
    )
    inputs = [draw((), F32, gen, specials=False), draw((0, 3), F32, gen), draw((4, 0), I64, gen)]
    check(gb.build(), inputs, None)


# --- reductions and normalizations --------------------------------------------------------------
def reductions(dtype: torch.dtype, shape: tuple[int, ...], dims: tuple[int, ...]) -> Graph:
    gb = GraphBuilder()
    x = gb.input("x", TensorType(shape, dtype))
    # NOTE: prod reduces one dim or all of them; over several, the product of products.
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


REDUCED = [((6, 9), (1,)), ((6, 9), (0,)), ((3, 4, 5), (0, 2)), ((7,), (0,)), ((4, 1, 3), (1,))]


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
@pytest.mark.parametrize("case", REDUCED, ids=[f"{s}-{d}" for s, d in REDUCED])
def test_float_reductions(dtype: torch.dtype, case: tuple[Any, Any]) -> None:
    """sum/prod/mean within the reduction budget, amax/amin bitwise; rows with a NaN give NaN."""
    shape, dims = case
    gen = torch.Generator().manual_seed(13)
    x = draw(shape, dtype, gen, (-1.5, 1.5), specials=False)
    x.view(-1)[1] = -0.0
    x.view(-1)[2] = math.nan
    x.view(-1)[-1] = -math.inf
    got = run_triton(reductions(dtype, shape, dims), [x])
    want = interpret(reductions(dtype, shape, dims), [x])
    names = ["sum", "prod", "amax", "amin", "mean"]
    for name, g, w in zip(names, got, want):
        assert_like(g, w, None if name in ("amax", "amin") else "reduction", name)


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


@pytest.mark.parametrize("dtype", FLOATS, ids=_ids(FLOATS))
def test_normalizations(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(15)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((6, 10), dtype))
    w = gb.input("w", TensorType((10,), dtype))
    bias = gb.input("bias", TensorType((10,), dtype))
    gb.output(
        gb.call("softmax", x, dim=1),
        gb.call("log_softmax", x, dim=0),
        gb.call("layer_norm", x, w, bias, normalized_shape=(10,)),
        gb.call("var", x, dims=(1,)),
        gb.call("var", x, dims=(0,), correction=0, keepdim=True),
        gb.call("logsumexp", x, dims=(1,)),
    )
    x_in = draw((6, 10), dtype, gen, specials=False)
    x_in[2, 3] = math.nan
    x_in[4, 1] = math.inf
    inputs = [
        x_in,
        draw((10,), dtype, gen, specials=False),
        draw((10,), dtype, gen, specials=False),
    ]
    check(gb.build(), inputs, "normalization")


def test_long_rows_loop_over_chunks() -> None:
    """Rows longer than a chunk: several loop iterations, a partial last chunk, NaN in a late
    chunk, every phase of softmax re-reading the row."""
    gen = torch.Generator().manual_seed(16)
    n = 5000
    gb = GraphBuilder()
    x = gb.input("x", TensorType((3, n), F32))
    i = gb.input("i", TensorType((2, n), I32))
    gb.output(
        gb.call("softmax", x, dim=1),
        gb.call("amax", x, dims=(1,)),
        gb.call("sum", x, dims=(1,)),
        gb.call("var", x, dims=(1,)),
        gb.call("sum", i, dims=(1,)),
    )
    x_in = draw((3, n), F32, gen, specials=False)
    x_in[1, 4500] = math.nan
    graph = gb.build()
    got = run_triton(graph, [x_in, draw((2, n), I32, gen)])
    want = interpret(graph, [x_in, draw((2, n), I32, torch.Generator().manual_seed(16))])
    assert_like(got[0], want[0], "normalization", "softmax")
    assert_like(got[1], want[1], None, "amax")
    assert_like(got[2], want[2], "reduction", "sum")
    assert_like(got[3], want[3], "reduction", "var")
    assert got[1][1].isnan() and got[0][1].isnan().all()


def test_many_short_rows() -> None:
    gen = torch.Generator().manual_seed(17)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((300, 3), F32))
    gb.output(gb.call("softmax", x, dim=1), gb.call("amin", x, dims=(1,)))
    x_in = draw((300, 3), F32, gen)
    # NOTE: no row holding both zeros: which one a max/min returns is the order of the
    # reduction's (the first in row order for the C++ kernels, a tree's on the GPU).
    x_in[x_in == 0] = 0.0
    check(gb.build(), [x_in], "normalization")
    blocks = reduction_blocks(300, 3)
    assert blocks.xblock > 1 and blocks.programs * blocks.xblock >= 300


def test_reduction_with_pointwise_prologue_and_epilogue() -> None:
    gen = torch.Generator().manual_seed(18)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((5, 12), BF16))
    b = gb.input("b", TensorType((12,), BF16))
    y = gb.call("tanh", gb.call("add", x, b))
    gb.output(gb.call("mul", gb.call("sum", y, dims=(1,), keepdim=True), 0.5))
    check(gb.build(), [draw((5, 12), BF16, gen, specials=False), draw((12,), BF16, gen)],
          "reduction")  # fmt: skip


def test_wide_indices_run_the_same() -> None:
    """int64 index arithmetic (chosen where an index nears 2**31), forced on small tensors."""
    gen = torch.Generator().manual_seed(19)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 9), F32))
    gb.output(gb.call("softmax", gb.call("flip", x, dims=(1,)), dim=1), gb.call("exp", x))
    graph = gb.build()
    kernels = [s.lowered.kernel for s in plan_graph(graph).steps if isinstance(s, KernelStep)]
    assert all("tl.int64" not in print_triton(k, "k").source for k in kernels)
    bound = triton_printer.INT32_BOUND
    try:
        triton_printer.INT32_BOUND = 1
        assert all("tl.int64)" in print_triton(k, "k").source for k in kernels)
        check(graph, [draw((4, 9), F32, gen)], "normalization")
    finally:
        triton_printer.INT32_BOUND = bound


def test_large_buffers_index_in_int64() -> None:
    b = KernelBuilder("k", outer=(Var("i0", 3 << 30),))
    x, y = b.buffer("x", "f32", 3 << 30), b.buffer("y", "f32", 3 << 30, output=True)
    i = Ix.var(b.outer[0])
    b.store(y, i, b.load(x, i))
    source = print_triton(b.build(nodes=()), "k").source
    assert "tl.program_id(0).to(tl.int64)" in source


# --- the loader ---------------------------------------------------------------------------------
def _copy_kernel() -> Kernel:
    b = KernelBuilder("copy", outer=(Var("i0", 5),))
    x, y = b.buffer("x", "f32", 5), b.buffer("y", "f32", 5, output=True)
    i = Ix.var(b.outer[0])
    b.store(y, i, b.op("add", [b.load(x, i), b.const(-0.0, "f32")], "f32"))
    return b.build(nodes=())


def test_loader_publishes_by_hash_and_rewrites_a_corrupt_file(stax_cache: Path) -> None:
    import hashlib

    ts = print_triton(_copy_kernel(), "copy_kernel")
    digest = hashlib.sha256(ts.source.encode()).hexdigest()
    path = stax_cache / "triton" / f"{digest}.py"
    x, y = torch.tensor([1.0, -0.0, 0.0, math.inf, math.nan]), torch.empty(5)
    load_triton(ts)(x, y)
    assert path.read_text() == ts.source
    assert_like(y, x + -0.0, None, "copy")
    path.write_text("corrupt")
    from plait.codegen import triton_load

    triton_load._MODULES.clear()
    load_triton(ts)(x, y)
    assert path.read_text() == ts.source


def test_empty_domain_launches_nothing() -> None:
    b = KernelBuilder("k", outer=(Var("i0", 0), Var("i1", 3)))
    x, y = b.buffer("x", "f32", 0), b.buffer("y", "f32", 0, output=True)
    i = Ix.var(b.outer[0]) * 3 + Ix.var(b.outer[1])
    b.store(y, i, b.load(x, i))
    ts = print_triton(b.build(nodes=()), "k")
    assert ts.grid == (0,)
    load_triton(ts)(torch.empty(0), torch.empty(0))


def test_printing_needs_no_triton() -> None:
    code = (
        "import sys; import plait.codegen.triton as t, plait.codegen.triton_load, "
        "plait.codegen.triton_interp; assert 'triton' not in sys.modules, 'imported triton'"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_storage_dtypes_round_trip() -> None:
    """bf16 and f16 buffers load exactly and store rounding to nearest even; bool buffers are
    bytes."""
    gen = torch.Generator().manual_seed(20)
    for dtype in (BF16, F16):
        ops: list[tuple[str, dict[str, Any]]] = [("to_dtype", {"dtype": F32}), ("neg", {})]
        x = draw((40,), dtype, gen)
        x[:4] = torch.tensor([1e-40, -1e-40, 6e-8, 65504.0]).to(dtype)
        check(one_op_each(ops, dtype, (40,)), [x, x], None)
    ops = [("to_dtype", {"dtype": t}) for t in (BF16, F16)]
    x = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, 7e4, 2**-140, -(2**-20), math.nan, -0.0])
    check(one_op_each(ops, F32, (8,)), [x, x], None)

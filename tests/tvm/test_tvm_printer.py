"""The TVM printer: graphs compiled by Stax with TVM kernels (``StaxOptions(kernels="tvm")``),
every kernel printed by TVM (none falling back to the C++ printer), against the reference
interpreter on fresh random inputs (never zeros) with NaN, +-0 and +-inf written in.

Exact ops (rounding, comparisons, selections, casts, integer arithmetic, max/min, IEEE division
and square root, 16-bit rounding, integer sums) must equal eager bitwise (a NaN may have other
payload bits); transcendentals are held to the contract's pointwise budget, float reductions to
its reduction or normalization budget, with NaN, infinities and signed zeros exact. The cases
are the Triton printer's (``tests/codegen/test_triton_printer.py``): the same IR, a third printer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
import torch

import plait.contract
from plait.codegen.options import StaxOptions
from plait.ir import Graph, GraphBuilder, TensorType, interpret
from plait.runtime import compile_graph
from tests.util import assert_bitwise, ieee_sqrt

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I64, I32, I16, I8 = torch.int64, torch.int32, torch.int16, torch.int8
U8, BOOL = torch.uint8, torch.bool
FLOATS = (F32, F64, BF16, F16)
INTS = (I64, I32, I16, I8, U8)
SPECIALS = (math.nan, 0.0, -0.0, math.inf, -math.inf)
TVM = StaxOptions(kernels="tvm")

pytestmark = pytest.mark.xdist_group("tvm-printer")


def run_tvm(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The graph's outputs from its Stax program, every kernel a TVM kernel."""
    program = compile_graph(graph, options=TVM)
    assert program.kernels, "no kernel to test"
    for k in program.kernels:
        assert k.printer == "tvm", f"{k.name} fell back to the C++ printer: {k.fallback}"
    return list(program(*inputs))


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
    got = run_tvm(graph, inputs)
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


def _ids(dtypes: Sequence[torch.dtype]) -> list[str]:
    return [str(d).removeprefix("torch.") for d in dtypes]


# --- pointwise math -----------------------------------------------------------------------------
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
EXACT_BINARY = ["add", "sub", "mul", "div", "div_trunc", "div_floor", "maximum", "minimum",
                "fmax", "fmin", "copysign", "eq", "ne", "lt", "le", "gt", "ge", "logical_xor",
                "logical_and", "logical_or"]  # fmt: skip
INEXACT_BINARY = ["atan2", "hypot", "pow", "xlogy"]


@pytest.mark.parametrize("dtype", (F32,), ids=_ids((F32,)))
def test_pointwise_float_ops(dtype: torch.dtype) -> None:
    """Transcendentals within the pointwise budget; exact unary and binary ops bitwise (binary
    ones broadcasting a row against a 3-d operand)."""
    gen = torch.Generator().manual_seed(1)
    graph = one_op_each([(op, {}) for op, _ in TRANSCENDENTAL], dtype, (5, 7))
    inputs = [draw((5, 7), dtype, gen, domain) for _, domain in TRANSCENDENTAL]
    check(graph, inputs, "pointwise", [op for op, _ in TRANSCENDENTAL])
    graph = one_op_each(EXACT_UNARY, dtype, (6, 5))
    inputs = [draw((6, 5), dtype, gen, (-300.0, 300.0) if "decimals" in a else (-4.0, 4.0))
              for _, a in EXACT_UNARY]  # fmt: skip
    check(graph, inputs, None, [op for op, _ in EXACT_UNARY])
    sa, sb = (3, 1, 6), (6,)
    for ops, op_class in ((EXACT_BINARY, None), (INEXACT_BINARY, "pointwise")):
        graph = binary_graph(ops, dtype, dtype, sa, sb)
        inputs = [draw(s, dtype, gen, (0.0, 4.0) if op == "xlogy" else (-4.0, 4.0))
                  for op in ops for s in (sa, sb)]  # fmt: skip
        for op, x in zip([op for op in ops for _ in (sa, sb)], inputs):
            if op in ("maximum", "minimum"):
                # NOTE: no tie of +0 and -0: of two equal values max/min return the second as
                # the C++ kernels do (below), eager the first
                x[x == 0] = 0.0
        check(graph, inputs, op_class, ops)


def test_sqrt_is_correctly_rounded() -> None:
    """The IEEE root bitwise; eager's within the pointwise budget, since eager's CPU sqrt (MKL's
    vector math where PyTorch links MKL) is within 1 ulp of it but not always on it."""
    gen = torch.Generator().manual_seed(3)
    graph = one_op_each([("sqrt", {})], F32, (16, 32))
    x = draw((16, 32), F32, gen, (-1.0, 8.0))
    (got,) = run_tvm(graph, [x])
    assert_bitwise(_nan_canonical(got.contiguous()), _nan_canonical(ieee_sqrt(x)), "sqrt")
    check(graph, [x], "pointwise", ["sqrt"])


def test_vector_blocks_call_the_vector_math_library() -> None:
    """Pointwise float32 kernels calling transcendentals are printed over vector lanes, calling
    libmvec's vector functions (where this machine has it): within the pointwise budget, NaN,
    infinities and signed zeros exact, broadcast operands and where/compare chains included."""
    from plait.codegen.build import cpu_info, toolchain
    from plait.codegen.tvm_vector import vector_isa

    if not toolchain().libmvec or vector_isa(cpu_info()[1]) is None:
        pytest.skip("no libmvec or no AVX2 here: vector blocks are not printed")
    gen = torch.Generator().manual_seed(31)
    # NOTE: without copysign (TVM's LLVM backend has no vector copysign): asinh, atanh, erfc
    # and the like stay scalar blocks
    vectored = [(op, d) for op, d in TRANSCENDENTAL if op in (
        "exp", "log", "tanh", "erf", "sin", "cos", "tan", "expm1", "log1p", "log2", "log10",
        "exp2", "sigmoid", "silu", "logsigmoid", "softplus", "elu", "rsqrt")]  # fmt: skip
    ops = [(op, {}) for op, _ in vectored]
    program = compile_graph(one_op_each(ops, F32, (4, 48)), options=TVM)
    assert all(k.printer == "tvm" and "_ZGV" in k.source
               for k in program.kernels), [k.fallback for k in program.kernels]  # fmt: skip
    inputs = [draw((4, 48), F32, gen, domain) for _, domain in vectored]
    got, want = program(*inputs), interpret(one_op_each(ops, F32, (4, 48)), inputs)
    for (op, _), g, w in zip(vectored, got, want):
        assert_like(g, w, "pointwise", op)
    gb = GraphBuilder()
    x = gb.input("x", TensorType((8, 64), F32))
    w = gb.input("w", TensorType((64,), F32))
    s = gb.input("s", TensorType((8, 1), F32))
    y = gb.call("mul", gb.call("add", x, w), s)
    gb.output(gb.call("gelu", y), gb.call("where", gb.call("gt", y, 0.5), gb.call("exp", y), -0.0))
    inputs = [draw((8, 64), F32, gen, specials=False), draw((64,), F32, gen),
              draw((8, 1), F32, gen, specials=False)]  # fmt: skip
    check(gb.build(), inputs, "pointwise")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", (F64, BF16, F16), ids=_ids((F64, BF16, F16)))
def test_pointwise_float_ops_wide_and_half(dtype: torch.dtype) -> None:
    test_pointwise_float_ops(dtype)


def test_float_simplifications_are_not_applied() -> None:
    """What TVM's simplifier would fold with integer algebra stays IEEE arithmetic: ``x - x``
    of an infinity is NaN, ``x * 0`` of one too, ``(x + 1) - 1`` rounds, ``x != x`` is NaN."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((6,), F32))
    gb.output(
        gb.call("sub", x, x),
        gb.call("mul", x, 0.0),
        gb.call("sub", gb.call("add", x, 1.0), 1.0),
        gb.call("ne", x, x),
        gb.call("neg", x),
        gb.call("div", x, x),
    )
    xs = torch.tensor([math.inf, math.nan, 1e-9, -0.0, 0.0, 3.0])
    check(gb.build(), [xs], None)


def test_signed_zero_ties_and_nan_follow_the_cpp_printer() -> None:
    """max/min give the second of two equal values, fmax/fmin the first (the C++ prelude);
    max/min propagate NaN, fmax/fmin ignore it."""
    gb = GraphBuilder()
    a = gb.input("a", TensorType((4,), F32))
    b = gb.input("b", TensorType((4,), F32))
    gb.output(*(gb.call(op, a, b) for op in ("maximum", "minimum", "fmax", "fmin")))
    xs = torch.tensor([0.0, -0.0, math.nan, 1.0])
    ys = torch.tensor([-0.0, 0.0, 2.0, math.nan])
    got = run_tvm(gb.build(), [xs, ys])
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
    gb.output(
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
    )
    inputs = [draw((4, 5), F16, gen), draw((5,), F64, gen), draw((4, 5), I32, gen),
              draw((4, 5), U8, gen)]  # fmt: skip
    check(gb.build(), inputs, None)


# --- integers and bools -------------------------------------------------------------------------
INT_BINARY = ["add", "sub", "mul", "maximum", "minimum", "fmax", "fmin", "bitwise_and",
              "bitwise_or", "bitwise_xor", "eq", "ne", "lt", "le", "gt", "ge"]  # fmt: skip
INT_DIVISION = ["div_trunc", "div_floor", "remainder", "fmod"]


@pytest.mark.parametrize("dtype", (I64, I8, U8), ids=_ids((I64, I8, U8)))
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


def test_integer_wraparound_division_by_zero_and_powers() -> None:
    """Wrapping products and sums, INT_MIN / -1 and % -1 as the C++ kernels give them,
    powers that overflow or have negative exponents; a zero divisor raises as in eager."""
    for dtype in (I64, I16):
        info = torch.iinfo(dtype)
        a = torch.tensor([info.min, info.max, info.min, -7, 7, info.max, -1, 0], dtype=dtype)
        b = torch.tensor([2, -1, 3, 2, -2, 2, -1, 5], dtype=dtype)
        ops = ["mul", "add", "div_trunc", "div_floor", "remainder", "fmod", "sub"]
        check(binary_graph(ops, dtype, dtype, (8,), (8,)), [a, b] * len(ops), None, ops)
        ops = ops[2:6]
        a, b = a[:1], torch.tensor([-1], dtype=dtype)
        got = run_tvm(binary_graph(ops, dtype, dtype, (1,), (1,)), [a, b] * len(ops))
        for op, g, want in zip(ops, got, (a, a, a * 0, a * 0)):
            assert_bitwise(g, want, f"{op}(INT_MIN, -1)")
        x = torch.tensor([3, -3, -1, 1, 2, 0, 7, -2], dtype=dtype)
        gb = GraphBuilder()
        xv = gb.input("x", TensorType((8,), dtype))
        gb.output(*(gb.call("pow", xv, e) for e in (0, 1, 3, 13, 40)))
        check(gb.build(), [x], None)
    program = compile_graph(binary_graph(["div_trunc"], I32, I32, (4,), (4,)), options=TVM)
    assert program.kernels[0].printer == "tvm"
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        program(torch.arange(4, dtype=I32), torch.tensor([1, 2, 0, 3], dtype=I32))


def test_a_tensor_exponent_falls_back_to_the_cpp_printer_recorded() -> None:
    """An integer power of a tensor exponent (a loop over its bits) is not printed for TVM: the
    C++ printer prints it, the kernel record and the node's evidence say why."""
    graph = binary_graph(["pow"], I32, I32, (5,), (5,))
    program = compile_graph(graph, options=TVM)
    (kernel,) = program.kernels
    assert kernel.printer == "cpp" and "exponent is not a constant" in kernel.fallback
    assert kernel.record()["fallback"] == kernel.fallback
    (node,) = [n for n in program.evidence.records()["nodes"] if n["op"] == "pow"]
    assert "[C++: the TVM printer refused it" in node["detail"]
    x, e = torch.tensor([3, -3, 2, 1, 0], dtype=I32), torch.tensor([2, 3, 30, -1, 0], dtype=I32)
    assert_bitwise(program(x, e)[0], torch.pow(x, e), "pow")


def test_bool_ops_are_bitwise() -> None:
    gen = torch.Generator().manual_seed(7)
    ops = ["logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
           "bitwise_xor", "eq", "ne", "maximum", "minimum", "add", "mul"]  # fmt: skip
    graph = binary_graph(ops, BOOL, BOOL, (5, 4), (4,))
    check(graph, [draw(s, BOOL, gen) for _ in ops for s in ((5, 4), (4,))], None, ops)
    gb = GraphBuilder()
    c = gb.input("c", TensorType((3, 4), BOOL))
    a = gb.input("a", TensorType((3, 4), BF16))
    gb.output(
        gb.call("where", c, a, -0.0),
        gb.call("where", c, gb.call("to_dtype", c, dtype=I64), 3),
        gb.call("bitwise_not", c),
        gb.call("to_dtype", c, dtype=F32),
    )
    check(gb.build(), [draw((3, 4), BOOL, gen), draw((3, 4), BF16, gen)], None)


def test_casts_and_16_bit_storage_round_to_nearest_even() -> None:
    """float -> integer casts truncate; float64 -> float32 / 16-bit and float32 -> 16-bit round
    to nearest even (overflow to infinity, subnormals); 16-bit buffers load exactly."""
    gen = torch.Generator().manual_seed(8)
    for src in (F32, F64, BF16):
        targets = [I64, I32, I16, I8, U8]
        ops = [("to_dtype", {"dtype": t}) for t in targets]
        inputs = [draw((9,), src, gen, (0.0 if t == U8 else -100.0, 100.0), specials=False)
                  for t in targets]  # fmt: skip
        check(one_op_each(ops, src, (9,)), inputs, None, _ids(targets))
    x = torch.tensor(
        [1 + 2**-24, 1 + 3 * 2**-24, 1e39, -1e39, 1e-40, 2**-149 * 0.5, 65520.0, 1 + 2**-8,
         1 + 3 * 2**-9, 3.0e38, -0.0, math.nan, 1e-8, -65504.0],
        dtype=F64,
    )  # fmt: skip
    ops = [("to_dtype", {"dtype": t}) for t in (F32, F16, BF16)]
    check(one_op_each(ops, F64, (14,)), [x, x, x], None)
    for dtype in (BF16, F16):
        y = draw((40,), dtype, gen)
        y[:4] = torch.tensor([1e-40, -1e-40, 6e-8, 65504.0]).to(dtype)
        ops = [("to_dtype", {"dtype": F32}), ("neg", {})]
        check(one_op_each(ops, dtype, (40,)), [y, y], None)

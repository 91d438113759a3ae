"""Scalar expressions of the TVM printer (:mod:`plait.codegen.tvm_script`): constants,
reductions' identities and combiners, and the C++ prelude's semantics spelled in TVMScript
(NaN-propagating max and min, C's unordered ``!=``, 16-bit rounding, integer and floor division,
integer powers), with float operands kept opaque to TVM's simplifier.

Example:
    >>> const_text(float("nan"), "f32"), const_text(-0.0, "f64")
    ('T.float32("nan")', 'T.float64(-0.0)')
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import platform
import struct
from collections.abc import Callable, Iterator, Mapping

from plait.codegen.kir import Reduce, Stmt, is_float, reduce_identity

DTYPE = {
    "f64": "float64",
    "f32": "float32",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u8": "uint8",
    "b": "bool",
}
BITS = {"i64": 64, "i32": 32, "i16": 16, "i8": 8, "u8": 8}
_F32_MAX = 3.4028234663852886e38
# NOTE: emits one statement of the current block
Emit = Callable[[str], None]
# NOTE: the lanes of the values being printed (1: scalars; more: a vector block's values)
_LANES: contextvars.ContextVar[int] = contextvars.ContextVar("tvm_lanes", default=1)


@contextlib.contextmanager
def vector_lanes(lanes: int) -> Iterator[None]:
    """Print values of ``lanes`` lanes (constants broadcast, types ``float32x16``)."""
    token = _LANES.set(lanes)
    try:
        yield
    finally:
        _LANES.reset(token)


def vector_type(name: str) -> str:
    """A TVM dtype name with the lanes being printed: ``float32`` or ``float32x16``."""
    lanes = _LANES.get()
    return name if lanes == 1 else f"{name}x{lanes}"


def _let(emit: Emit) -> Callable[[str, str, str], None]:
    def let(name: str, t: str, value: str) -> None:
        emit(f"{name}: T.let[T.{DTYPE[t]}] = {value}")

    return let


def f32_of(value: float) -> float:
    """``value`` rounded to float32 as C's ``(float)`` does (overflow gives an infinity)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def const_text(value: object, t: str) -> str:
    """A constant of scalar type ``t``, exact (NaN, infinities, -0.0, float32 rounding);
    broadcast where vectors are printed."""
    text = _scalar_const(value, t)
    lanes = _LANES.get()
    return text if lanes == 1 else f"T.Broadcast({text}, {lanes})"


def _scalar_const(value: object, t: str) -> str:
    name = DTYPE[t]
    if t == "b":
        return f"T.bool({bool(value)})"
    if not is_float(t):
        assert isinstance(value, int)
        return f"T.{name}({int(value)})"
    assert isinstance(value, float)
    v = f32_of(value) if t == "f32" else value
    if math.isnan(v) or math.isinf(v):
        return f'T.{name}("{"nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}")'
    if abs(v) > _F32_MAX:
        # NOTE: TVMScript's parser refuses a float literal past float32's range, whatever its
        # dtype: the double from its bits
        (word,) = struct.unpack("<q", struct.pack("<d", v))
        return f'T.reinterpret("float64", T.int64({word}))'
    return f"T.{name}({v!r})"


def identity(kind: str, t: str) -> object:
    """A reduction's initial value (every printer's: :func:`plait.codegen.kir.reduce_identity`)."""
    return reduce_identity(kind, t)


def identity_text(kind: str, t: str) -> str:
    if kind == "flag":
        return 'T.min_value("int32")'
    if kind in ("sum", "prod"):
        return const_text(identity(kind, t), t)
    # NOTE: TensorIR's identities (what it recognizes max and min reductions by); a float's
    # infinities come from the flag
    return f'T.{"min" if kind == "max" else "max"}_value("{DTYPE[t]}")'


def combine(r: Reduce, acc: str, v: str) -> str:
    if is_float(r.dtype):
        v = opaque(v, r.dtype, 1)
    if r.kind == "sum":
        return f"{acc} + {v}"
    if r.kind == "prod":
        return f"{acc} * {v}"
    return f"T.{r.kind}({acc}, {v})"


def nan_extremum(kind: str, t: str, acc: str, v: str) -> str:
    """A float max (or min) reduction's step as the C++ kernels' (``max_(acc, v)``, tracking
    NaN): a NaN ``v`` becomes the result, a NaN ``acc`` stays (ordered comparisons are false
    for it), of equal values ``acc`` stays. One pass, no flag: what a vector block of lanes
    accumulates, and how it combines them."""
    x, y = opaque(v, t, 0), opaque(acc, t, 1)
    return select(f"T.isnan({v})", v, select(f"{x} {'>' if kind == 'max' else '<'} {y}", v, acc))


def extremum(op: str, t: str, a: str, b: str) -> str:
    if t == "b":
        x, y = as_byte(a), as_byte(b)
        return select(f"{x} > {y}" if op in ("max", "fmax") else f"{x} < {y}", a, b)
    if not is_float(t):
        return select(f"{a} > {b}" if op in ("max", "fmax") else f"{a} < {b}", a, b)
    x, y = opaque(a, t, 0), opaque(b, t, 1)
    nan_a, nan_b = f"T.isnan({a})", f"T.isnan({b})"
    if op == "max":
        return select(nan_a, a, select(nan_b, b, select(f"{x} > {y}", a, b)))
    if op == "min":
        return select(nan_a, a, select(nan_b, b, select(f"{x} < {y}", a, b)))
    # NOTE: fmax/fmin ignore a NaN operand; of two equal values (+0, -0) the first, as eager
    if op == "fmax":
        return select(nan_a, b, select(nan_b, a, select(f"{x} < {y}", b, a)))
    return select(nan_a, b, select(nan_b, a, select(f"{y} < {x}", b, a)))


def as_byte(x: str) -> str:
    return f'T.Cast("int8", {x})'


def select(cond: str, a: str, b: str) -> str:
    return f"T.Select({cond}, {a}, {b})"


def _opposite(r: str, b: str, zero: str) -> str:
    """A nonzero remainder whose sign differs from the divisor's (floor division adjusts)."""
    return f"T.And({r} != {zero}, {as_byte(f'{r} < {zero}')} != {as_byte(f'{b} < {zero}')})"


def opaque(x: str, t: str, side: int) -> str:
    """A float operand TVM's simplifier cannot see into: it applies integer algebra to floats
    (``x - x`` to 0, ``x * 0`` to 0, ``(x + y) - y`` to ``x``), which changes what IEEE
    arithmetic computes. A round trip through the bits (free: LLVM folds it), through an unsigned
    integer for a left operand and a signed one for a right, so that two operands are never
    structurally equal.

    Example:
        >>> opaque("a", "f32", 0)
        'T.reinterpret("float32", T.reinterpret("uint32", a))'
    """
    bits = "64" if t == "f64" else "32"
    word = vector_type(f"{'u' if side == 0 else ''}int{bits}")
    return f'T.reinterpret("{vector_type(DTYPE[t])}", T.reinterpret("{word}", {x}))'


def product(x: str, y: str, t: str) -> str:
    """A float product no addition may fuse with: TVM's LLVM target contracts ``a * b + c``
    into one FMA (one rounding; ``FPOpFusion::Fast``, whatever the IR's flags), where the C++
    kernels (``-ffp-contract=off``) and eager round the product first. An arithmetic fence
    around the product (free: no instruction) keeps it rounded.

    Example:
        >>> product("a", "b", "f32")
        'T.call_llvm_pure_intrin("float32", "llvm.arithmetic.fence", (a * b))'
    """
    return (
        f'T.call_llvm_pure_intrin("{vector_type(DTYPE[t])}", "llvm.arithmetic.fence", ({x} * {y}))'
    )


# NOTE: PyTorch's CPU casts convert with the machine's instruction: x86's gives the lowest
# integer for NaN and out-of-range values; others' (AArch64's) saturate, NaN to 0
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def float_to_int(x: str, src: str, wide: str) -> str:
    """``x`` (a float of type ``src``) converted to ``wide`` (``int32`` or ``int64``) as the
    machine's conversion instruction does, NaN and out-of-range values written out: LLVM's
    conversion of such a value is poison (the C++ prelude's ``f2i``).

    Example:
        >>> float_to_int("a", "f64", "int32")  # doctest: +ELLIPSIS
        'T.Select(...'
    """
    bits = 32 if wide == "int32" else 64
    d = x if src == "f64" else f'T.Cast("{vector_type("float64")}", {x})'
    lo, hi = const_text(-(2.0 ** (bits - 1)), "f64"), const_text(2.0 ** (bits - 1), "f64")
    cast = f'T.Cast("{vector_type(wide)}", {d})'
    key = "i32" if bits == 32 else "i64"
    low, high = const_text(-(2 ** (bits - 1)), key), const_text(2 ** (bits - 1) - 1, key)
    if _X86:
        return f"T.Select({d} >= {lo}, T.Select({d} < {hi}, {cast}, {low}), {low})"
    zero = const_text(0, key)
    inner = f"T.Select({d} >= {hi}, {high}, T.Select({d} < {lo}, {low}, {cast}))"
    return f"T.Select({d} != {d}, {zero}, {inner})"


def float_ne(a: str, b: str, t: str) -> str:
    """C's ``a != b`` of floats (true where either is NaN): TVM's ``!=`` is LLVM's ordered
    comparison (false for NaN)."""
    x, y = opaque(a, t, 0), opaque(b, t, 1)
    return f"T.Or({x} != {y}, T.Or(T.isnan({a}), T.isnan({b})))"


def signbit(x: str, t: str) -> str:
    if t == "f64":
        return f'(T.shift_right(T.reinterpret("uint64", {x}), T.uint64(63)) != T.uint64(0))'
    return f'(T.shift_right(T.reinterpret("uint32", {x}), T.uint32(31)) != T.uint32(0))'


def bf16_bits(v: str, rounded: bool = False) -> str:
    """The nearest bfloat16's bits (ties to even; NaN: 0x7FC0), as ``uint16``; of a value
    ``rounded`` to bfloat16 already (:func:`round16`), its upper half."""
    u = f'T.reinterpret("uint32", {v})'
    if rounded:
        return f'T.Cast("uint16", T.shift_right({u}, T.uint32(16)))'
    odd = f"T.bitwise_and(T.shift_right({u}, T.uint32(16)), T.uint32(1))"
    nearest = f'T.Cast("uint16", T.shift_right({u} + T.uint32(32767) + {odd}, T.uint32(16)))'
    return f"T.Select(T.isnan({v}), T.uint16(32704), {nearest})"


def holds_bf16_rounding(s: Stmt, names: Mapping[int, str]) -> bool:
    """Whether ``s``, as printed (inlined, but for the statements bound in ``names``), rounds
    to bfloat16 somewhere."""
    todo, seen = [s], set()
    while todo:
        x = todo.pop()
        if x.id in seen or x.id in names:
            continue
        if x.op == "round" and x.attr == "bf16":
            return True
        seen.add(x.id)
        todo.extend(x.args)
    return False


def local_scalar(name: str, t: str, value: str) -> tuple[str, str]:
    """The lines of a block's local scalar ``name`` (of type ``t``, of the lanes being printed)
    set to ``value``, read as ``name[0]``: a load, which TVM's simplifier and code generator
    leave as it is, where they expand a ``T.let`` (or ``T.Let``) value into each of its reads.

    Example:
        >>> local_scalar("r", "f32", "a + b")[1]
        'r[0] = a + b'
    """
    alloc = f'T.sblock_alloc_buffer((1,), "{vector_type(DTYPE[t])}", scope="local")'
    return f"{name} = {alloc}", f"{name}[0] = {value}"


def round16(v: str, storage: str) -> str:
    """An f32 value rounded to a 16-bit float's precision (exactly, as it would be stored)."""
    if storage == "bf16":
        bits = bf16_bits(v)
        return f'T.reinterpret("float32", T.shift_left(T.Cast("uint32", {bits}), T.uint32(16)))'
    return f'T.Cast("float32", T.Cast("float16", {v}))'


def integer_division(op: str, t: str, a: str, b: str, n: str, emit: Emit) -> None:
    """``n = op(a, b)`` as the C++ prelude's ``idiv_trunc`` (and friends): 0 for a zero
    divisor (reported in ``err``), ``-a`` (wrapping) for -1; a safe divisor is divided by
    (both sides of a select are computed)."""
    let = _let(emit)
    zero, one = const_text(0, t), const_text(1, t)
    signed = t != "u8"
    emit(f"if {b} == {zero}:")
    emit("    err[0] = T.int32(1)")
    bad = f"T.Or({b} == {zero}, {b} == {const_text(-1, t)})" if signed else f"{b} == {zero}"
    let(f"{n}_d", t, f"T.Select({bad}, {one}, {b})")
    q = f"T.truncdiv({a}, {n}_d)"
    r = f"T.truncmod({a}, {n}_d)"
    if op in ("imod_trunc", "imod_floor"):
        let(f"{n}_r", t, r)
        value = f"{n}_r"
        if op == "imod_floor":
            value = select(_opposite(f"{n}_r", b, zero), f"{n}_r + {b}", f"{n}_r")
        let(n, t, value)
        return
    let(f"{n}_q", t, q)
    value = f"{n}_q"
    if op == "idiv_floor":
        let(f"{n}_r", t, r)
        value = select(_opposite(f"{n}_r", b, zero), f"{n}_q - {one}", f"{n}_q")
    if signed:
        value = f"T.Select({b} == {const_text(-1, t)}, {zero} - {a}, {value})"
    let(n, t, f"T.Select({b} == {zero}, {zero}, {value})")


def floor_division(t: str, a: str, b: str, n: str, emit: Emit) -> None:
    """``n`` as ATen's ``div_floor_floating`` of ``a`` and ``b`` (the C++ prelude's
    ``fdiv_floor``)."""
    let = _let(emit)
    zero, one, half = (const_text(v, t) for v in (0.0, 1.0, 0.5))
    fmod = "fmodf" if t == "f32" else "fmod"
    let(f"{n}_m", t, f'T.call_pure_extern("{DTYPE[t]}", "{fmod}", {a}, {b})')

    def op(x: str, sign: str, y: str) -> str:
        return f"({opaque(x, t, 0)} {sign} {opaque(y, t, 1)})"

    quotient = op(a, "/", b)
    let(f"{n}_q0", t, f"{op(op(a, '-', f'{n}_m'), '/', b)}")
    signs = f"{as_byte(op(b, '<', zero))} != {as_byte(op(f'{n}_m', '<', zero))}"
    adjust = f"T.And({float_ne(f'{n}_m', zero, t)}, {signs})"
    let(f"{n}_q", t, select(adjust, op(f"{n}_q0", "-", one), f"{n}_q0"))
    let(f"{n}_f0", t, f"T.floor({n}_q)")
    up = op(op(f"{n}_q", "-", f"{n}_f0"), ">", half)
    let(f"{n}_f", t, select(up, op(f"{n}_f0", "+", one), f"{n}_f0"))
    value = select(float_ne(f"{n}_q", zero, t), f"{n}_f", f"T.copysign({zero}, {quotient})")
    let(n, t, select(op(b, "==", zero), quotient, value))


def integer_power(t: str, a: str, e: int, n: str, emit: Emit) -> None:
    """``n`` as the C++ prelude's ``ipow`` of ``a`` and a constant exponent ``e``: square
    and multiply over the exponent's bits (wrapping); a negative exponent gives 1, -1 or 0
    as the prelude does."""
    let = _let(emit)
    zero, one, minus = const_text(0, t), const_text(1, t), const_text(-1, t)
    if e < 0:
        value = select(
            f"{a} == {one}", one, select(f"{a} == {minus}", minus if e % 2 else one, zero)
        )
        let(n, t, value)
        return
    factors, square = [], a
    for j in range(e.bit_length()):
        if j:
            let(f"{n}_a{j}", t, f"({square} * {square})")
            square = f"{n}_a{j}"
        if e >> j & 1:
            factors.append(square)
    value = one
    for f in factors:
        value = f if value == one else f"({value} * {f})"
    let(n, t, value)

"""The text pieces of printed Triton kernels: dtypes, exact constants, sizes (literals, or int64
expressions over a symbolic kernel's size arguments) and :class:`TritonSource`, a printed kernel
with its launch shape (:mod:`plait.codegen.triton` prints it).

Example:
    >>> const_text(-0.0, "f32")
    'tl.full([], -2147483648, tl.int32).to(tl.float32, bitcast=True)'
    >>> from plait.symbolic import symbol
    >>> from plait.symbolic.poly import from_dim
    >>> size_text(3 * from_dim(symbol("s0")) + 1), size_arg("s0")
    ('(3*n_s0 + 1)', 'sz_s0')
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from plait.codegen.kir import ITEMSIZE, is_float
from plait.symbolic.poly import Size, evaluate, to_text

TL = {
    "f64": "tl.float64",
    "f32": "tl.float32",
    "i64": "tl.int64",
    "i32": "tl.int32",
    "i16": "tl.int16",
    "i8": "tl.int8",
    "u8": "tl.uint8",
    "b": "tl.int1",
}


@dataclass(frozen=True)
class TritonSource:
    """A printed kernel: ``source`` is a module defining the ``@triton.jit`` function ``symbol``
    (one pointer argument per kernel buffer), launched on ``grid`` with ``num_warps``. A grid
    with a zero has nothing to run (an empty domain).

    A symbolic kernel also takes the values of the size atoms ``sizes`` (in that order, after
    the pointers); its grid is ``ceil(rows / xblock)`` programs at the call's sizes (``grid``
    is the grid at the hints, ``hints`` the atoms' values there, for compiling ahead)."""

    symbol: str
    source: str
    grid: tuple[int, ...]
    num_warps: int
    sizes: tuple[str, ...] = ()
    rows: Size = 0
    xblock: int = 1
    hints: tuple[int, ...] = ()

    def programs(self, values: tuple[int, ...]) -> int:
        """The grid's one dim at the size atoms' ``values`` (in ``sizes`` order)."""
        rows = evaluate(self.rows, dict(zip(self.sizes, values)))
        return -(-rows // self.xblock) if rows > 0 else 0


# --- constants and indices --------------------------------------------------------------------
def f32_of(value: float) -> float:
    """``value`` rounded to float32 as C's ``(float)`` does (overflow gives an infinity)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def wrap_int(value: int, t: str) -> int:
    """``value`` converted to integer type ``t`` as C's cast (and eager's scalar) does: modulo
    2**bits, into the type's range (``tl.full`` refuses a value out of range).

    >>> wrap_int(300, "i8"), wrap_int(-3, "u8"), wrap_int(1 << 63, "i64")
    (44, 253, -9223372036854775808)
    """
    bits = ITEMSIZE[t] * 8
    value %= 1 << bits
    if t != "u8" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def const_text(value: object, t: str, shape: str = "[]") -> str:
    """A constant of scalar type ``t`` (exact: NaN, infinities, -0.0, f32 rounding)."""
    dtype = TL[t]
    if t == "b":
        return f"tl.full({shape}, {bool(value)}, {dtype})"
    if not is_float(t):
        assert isinstance(value, int)
        return f"tl.full({shape}, {wrap_int(value, t)}, {dtype})"
    assert isinstance(value, float)
    v = f32_of(value) if t == "f32" else value
    if math.isnan(v) or (v == 0 and math.copysign(1.0, v) < 0):
        # NOTE: NaN and -0.0 from their bits: Triton folds any zero constant to +0.0, and a
        # NaN global would fail its check that globals are unchanged (NaN != NaN).
        float_fmt, int_fmt, bits = "<f", "<i", "tl.int32"
        if t == "f64":
            float_fmt, int_fmt, bits = "<d", "<q", "tl.int64"
        (word,) = struct.unpack(int_fmt, struct.pack(float_fmt, v))
        return f"tl.full({shape}, {word}, {bits}).to({dtype}, bitcast=True)"
    if math.isinf(v):
        text = "INF" if v > 0 else "NEG_INF"
    else:
        text = repr(v)
    return f"tl.full({shape}, {text}, {dtype})"


def size_arg(atom: str) -> str:
    """The kernel argument holding a size atom's value."""
    return f"sz_{atom}"


def size_text(x: Size) -> str:
    """A size as kernel code: a literal, or an int64 expression over the size arguments."""
    if isinstance(x, int):
        return str(x)
    return f"({to_text(x, lambda a: f'n_{a}')})"

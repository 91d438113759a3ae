"""The fixed text of a printed Triton kernel's module: its header (imports, the infinities) and
the ``@triton.jit`` helpers a kernel calls (bfloat16 rounding, NaN-propagating max and min,
integer division and powers with C++'s results), each included only where the kernel uses it,
after the helpers it calls.

Example:
    >>> sorted(with_needs("_imod_floor"))
    ['_imod_floor', '_imod_trunc', '_safe_divisor']
    >>> [line for line in helpers_text({"_prod"}).splitlines() if line.startswith("def")]
    ['def _prod(a, b):']
"""

from __future__ import annotations

from collections.abc import Iterable

# NOTE: nothing of the program (not the kernel's name in it) goes into the text: a kernel's
# symbol is the hash of its text, so identical kernels (the layers of a transformer) are one
# Triton function, compiled once.
_HEADER = '''"""Triton kernel {symbol}, printed by plait.codegen.triton.

M is bound by the loader before this module runs: libdevice on a GPU, a numpy shim when Triton
interprets the kernel.
"""

import triton
import triton.language as tl

INF = tl.constexpr(float("inf"))
NEG_INF = tl.constexpr(float("-inf"))
'''

# NOTE: jit helpers, included where used. Integer ``//`` and ``%`` of Triton tensors truncate
# (C's sdiv/srem) compiled and interpreted alike; divisors 0 and -1 are replaced before dividing
# (division by zero and INT_MIN / -1 are undefined on the GPU) and their results written as the
# C++ prelude's: 0 for a zero divisor, -a (wrapping) for -1.
_HELPERS: dict[str, str] = {
    "_bf16_bits": """
@triton.jit
def _bf16_bits(x):
    # the nearest bfloat16's bits (ties to even; NaN: 0x7FC0) in the low half of a uint32
    u = x.to(tl.uint32, bitcast=True)
    sixteen = tl.full([], 16, tl.uint32)
    odd = (u >> sixteen) & tl.full([], 1, tl.uint32)
    rounded = (u + tl.full([], 0x7FFF, tl.uint32) + odd) >> sixteen
    return tl.where(x != x, tl.full([], 0x7FC0, tl.uint32), rounded)
""",
    "_bf16_round": """
@triton.jit
def _bf16_round(x):
    return (_bf16_bits(x) << tl.full([], 16, tl.uint32)).to(tl.float32, bitcast=True)
""",
    "_bf16_store": """
@triton.jit
def _bf16_store(x):
    return _bf16_bits(x).to(tl.uint16).to(tl.bfloat16, bitcast=True)
""",
    "_bf16_load": """
@triton.jit
def _bf16_load(h):
    u = h.to(tl.uint16, bitcast=True).to(tl.uint32) << tl.full([], 16, tl.uint32)
    return u.to(tl.float32, bitcast=True)
""",
    "_max_nan": """
@triton.jit
def _max_nan(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.where(a > b, a, b)))
""",
    "_min_nan": """
@triton.jit
def _min_nan(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.where(a < b, a, b)))
""",
    "_fmax": """
@triton.jit
def _fmax(a, b):
    # NaN ignored; of two equal values (+0, -0) the first, as eager
    return tl.where(a != a, b, tl.where(b != b, a, tl.where(a < b, b, a)))
""",
    "_fmin": """
@triton.jit
def _fmin(a, b):
    return tl.where(a != a, b, tl.where(b != b, a, tl.where(b < a, b, a)))
""",
    "_fdiv_floor": """
@triton.jit
def _fdiv_floor(a, b):
    # ATen's div_floor_floating
    zero = tl.full([], 0.0, a.dtype)
    one = tl.full([], 1.0, a.dtype)
    quotient = M.div_rn(a, b)
    mod = M.fmod(a, b)
    div = M.div_rn(a - mod, b)
    div = tl.where((mod != zero) & ((b < zero) != (mod < zero)), div - one, div)
    floor = M.floor(div)
    floor = tl.where(div - floor > tl.full([], 0.5, a.dtype), floor + one, floor)
    floor = tl.where(div != zero, floor, M.copysign(zero, quotient))
    return tl.where(b == zero, quotient, floor)
""",
    "_safe_divisor": """
@triton.jit
def _safe_divisor(b, SIGNED: tl.constexpr):
    bad = b == tl.full([], 0, b.dtype)
    if SIGNED:
        bad = bad | (b == tl.full([], -1, b.dtype))
    return tl.where(bad, tl.full([], 1, b.dtype), b)
""",
    "_idiv_trunc": """
@triton.jit
def _idiv_trunc(a, b, SIGNED: tl.constexpr):
    zero = tl.full([], 0, a.dtype)
    q = a // _safe_divisor(b, SIGNED)
    if SIGNED:
        q = tl.where(b == tl.full([], -1, a.dtype), zero - a, q)
    return tl.where(b == zero, zero, q)
""",
    "_idiv_floor": """
@triton.jit
def _idiv_floor(a, b, SIGNED: tl.constexpr):
    zero = tl.full([], 0, a.dtype)
    d = _safe_divisor(b, SIGNED)
    q = a // d
    r = a % d
    q = tl.where((r != zero) & ((r < zero) != (b < zero)), q - tl.full([], 1, a.dtype), q)
    if SIGNED:
        q = tl.where(b == tl.full([], -1, a.dtype), zero - a, q)
    return tl.where(b == zero, zero, q)
""",
    "_imod_trunc": """
@triton.jit
def _imod_trunc(a, b, SIGNED: tl.constexpr):
    # the safe divisor 1 leaves 0 where b is 0 or -1
    return a % _safe_divisor(b, SIGNED)
""",
    "_imod_floor": """
@triton.jit
def _imod_floor(a, b, SIGNED: tl.constexpr):
    zero = tl.full([], 0, a.dtype)
    r = _imod_trunc(a, b, SIGNED)
    return tl.where((r != zero) & ((r < zero) != (b < zero)), r + b, r)
""",
    "_ipow": """
@triton.jit
def _ipow(a, b, BITS: tl.constexpr, SIGNED: tl.constexpr):
    # square and multiply over the exponent's bits; negative exponents as the C++ prelude
    zero = tl.full([], 0, a.dtype)
    one = tl.full([], 1, a.dtype)
    base = a + b * zero
    e = b + a * zero
    result = base * zero + one
    for _ in tl.static_range(BITS):
        result = tl.where((e & one) != zero, result * base, result)
        e = e >> one
        base = base * base
    if SIGNED:
        minus_one = tl.full([], -1, a.dtype)
        odd = (b & one) != zero
        inverse = tl.where(a == minus_one, tl.where(odd, minus_one, one), zero)
        result = tl.where(b < zero, tl.where(a == one, one, inverse), result)
    return result
""",
    "_prod": """
@triton.jit
def _prod(a, b):
    return a * b
""",
}
_HELPER_NEEDS = {
    "_bf16_round": ("_bf16_bits",),
    "_bf16_store": ("_bf16_bits",),
    "_idiv_trunc": ("_safe_divisor",),
    "_idiv_floor": ("_safe_divisor",),
    "_imod_trunc": ("_safe_divisor",),
    "_imod_floor": ("_imod_trunc", "_safe_divisor"),
}


def module_header(symbol: str) -> str:
    """The start of the module that defines kernel ``symbol``."""
    return _HEADER.format(symbol=symbol)


def with_needs(name: str) -> set[str]:
    """Helper ``name`` with the helpers it calls."""
    return {name, *_HELPER_NEEDS.get(name, ())}


def helpers_text(names: Iterable[str]) -> str:
    """The definitions of the helpers ``names``, each after those it calls."""
    wanted = set(names)
    return "".join(_HELPERS[name] for name in _HELPERS if name in wanted)

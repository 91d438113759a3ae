"""Pointwise math and activations through ``plait.compile``: native kernels, equal to eager.

Every op of the table runs in a chain (a post-op fuses into its kernel) on several shapes at once
(broadcasting, 0-d, empty, non-contiguous) in every dtype family it accepts; each program is
called on fresh random draws and on a draw with NaN, +-0 and +-inf written in, beside eager.
Exact ops (rounding, signs, predicates, fmod, remainder, fmax, bitwise) must equal eager
bitwise; libm's functions are held to the contract's pointwise budget (NaN, infinities and the
sign of zero exactly). The Stax evidence must show each op executed natively, with no opaque
node or fallback in the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
import plait.contract
from plait.codegen.extern import FLOAT_EXTERNS
from tests.util import assert_bitwise

F32, F64, BF16, F16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
I64, I32, U8, BOOL = torch.int64, torch.int32, torch.uint8, torch.bool
FLOATS = (F32, F64, BF16, F16)
INTS = (I64, I32, U8)
SPECIALS = (math.nan, 0.0, -0.0, math.inf, -math.inf)


@dataclass(frozen=True)
class Case:
    op: str  # the IR op the call must become
    fn: Callable[..., Any]
    dtypes: tuple[torch.dtype, ...]
    exact: bool
    domain: tuple[float, float] = (-4.0, 4.0)
    arity: int = 1
    divides: bool = False  # integer divisors must not be zero


def _math(op: str, domain: tuple[float, float] = (-3.0, 3.0)) -> Case:
    return Case(op, getattr(torch, op), (*FLOATS, I64, BOOL), False, domain)


CASES: list[Case] = [
    _math("sin"),
    _math("cos"),
    _math("tan", (-1.5, 1.5)),
    _math("asin", (-1.0, 1.0)),
    _math("acos", (-1.0, 1.0)),
    _math("atan"),
    _math("sinh"),
    _math("cosh"),
    _math("asinh"),
    _math("acosh", (1.0, 6.0)),
    _math("atanh", (-0.99, 0.99)),
    _math("expm1"),
    _math("log1p", (-0.95, 4.0)),
    _math("log2", (0.05, 6.0)),
    _math("log10", (0.05, 6.0)),
    _math("exp2"),
    _math("erfc"),
    Case("floor", torch.floor, (*FLOATS, *INTS), True),
    Case("ceil", torch.ceil, (*FLOATS, *INTS), True),
    Case("trunc", torch.trunc, (*FLOATS, *INTS), True),
    Case("round", torch.round, (*FLOATS, *INTS), True),
    Case("round", lambda x: torch.round(x, decimals=2), FLOATS, True, (-300.0, 300.0)),
    Case("round", lambda x: x.round(decimals=-1), FLOATS, True, (-300.0, 300.0)),
    Case("frac", torch.frac, FLOATS, True),
    Case("sign", torch.sign, (*FLOATS, *INTS, BOOL), True),
    Case("signbit", torch.signbit, (*FLOATS, *INTS, BOOL), True),
    Case("isnan", torch.isnan, (*FLOATS, I64, BOOL), True),
    Case("isinf", torch.isinf, (*FLOATS, I64, BOOL), True),
    Case("isfinite", torch.isfinite, (*FLOATS, I64, BOOL), True),
    Case("isposinf", torch.isposinf, (*FLOATS, I64), True),
    Case("isneginf", torch.isneginf, (*FLOATS, I64), True),
    Case("bitwise_not", torch.bitwise_not, (*INTS, BOOL), True),
    Case("nan_to_num", torch.nan_to_num, (*FLOATS, I64, BOOL), True),
    Case("nan_to_num", lambda x: x.nan_to_num(1.5, 100.3, -7.1), FLOATS, True),
    Case("atan2", torch.atan2, (*FLOATS, I64), False, arity=2),
    Case("hypot", torch.hypot, FLOATS, False, arity=2),
    Case("copysign", torch.copysign, (*FLOATS, I64), True, arity=2),
    Case("fmod", torch.fmod, (*FLOATS, *INTS), True, arity=2, divides=True),
    Case("remainder", torch.remainder, (*FLOATS, *INTS), True, arity=2, divides=True),
    Case("fmax", torch.fmax, (*FLOATS, *INTS), True, arity=2),
    Case("fmin", torch.fmin, (*FLOATS, *INTS), True, arity=2),
    Case("xlogy", torch.xlogy, (*FLOATS, I64), False, (0.0, 4.0), arity=2),
    Case("logical_xor", torch.logical_xor, (*FLOATS, I64, BOOL), True, arity=2),
    Case("bitwise_and", torch.bitwise_and, (*INTS, BOOL), True, arity=2),
    Case("bitwise_or", torch.bitwise_or, (*INTS, BOOL), True, arity=2),
    Case("bitwise_xor", torch.bitwise_xor, (*INTS, BOOL), True, arity=2),
    Case("leaky_relu", lambda x: F.leaky_relu(x, 0.2), FLOATS, True, (-6.0, 6.0)),
    Case("hardsigmoid", F.hardsigmoid, FLOATS, True, (-6.0, 6.0)),
    Case("hardswish", F.hardswish, FLOATS, True, (-6.0, 6.0)),
    Case("elu", F.elu, FLOATS, False, (-6.0, 6.0)),
    Case("elu", F.selu, FLOATS, False, (-6.0, 6.0)),
    Case("elu", lambda x: F.celu(x, 0.7), FLOATS, False, (-6.0, 6.0)),
    Case("softplus", lambda x: F.softplus(x, 2.0, 4.0), FLOATS, False, (-6.0, 6.0)),
    Case("mish", F.mish, FLOATS, False, (-6.0, 6.0)),
    Case("logsigmoid", F.logsigmoid, FLOATS, False, (-6.0, 6.0)),
    Case("hardshrink", lambda x: F.hardshrink(x, 0.3), FLOATS, True, (-1.0, 1.0)),
    Case("softshrink", lambda x: F.softshrink(x, 0.3), FLOATS, True, (-1.0, 1.0)),
    Case("threshold", lambda x: F.threshold(x, 0.1, 20.0), FLOATS, True, (-1.0, 1.0)),
]
# (shape of the first operand, of the second, non-contiguous)
SHAPES: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = [
    ((5, 7), (5, 7), False),
    ((3, 1, 6), (6,), False),
    ((), (4,), False),
    ((0, 3), (1, 3), False),
    ((6, 5), (6, 5), True),
]


def _draw(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    case: Case,
    gen: torch.Generator,
    noncontig: bool,
    divisor: bool,
) -> torch.Tensor:
    if noncontig:
        wide = _draw((*shape[:-1], shape[-1] * 2), dtype, case, gen, False, divisor)
        return wide[..., ::2]
    if dtype == BOOL:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        lo, hi = (1, 9) if divisor else ((0, 40) if dtype == U8 else (-40, 40))
        t = torch.randint(lo, hi, shape, generator=gen)
        if divisor and dtype != U8:
            t = t * (torch.randint(0, 2, shape, generator=gen) * 2 - 1)  # both signs
        return t.to(dtype)
    lo, hi = case.domain
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    return (lo + (hi - lo) * u).to(dtype)


def _with_specials(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if not t.is_floating_point() or t.numel() == 0:
        return t
    out = t.clone()
    flat = out.view(-1) if out.is_contiguous() else None
    if flat is None:
        dense = out.contiguous()
        _write_specials(dense.view(-1), gen)
        return out.copy_(dense)
    _write_specials(flat, gen)
    return out


def _write_specials(flat: torch.Tensor, gen: torch.Generator) -> None:
    n = flat.numel()
    where = torch.randperm(n, generator=gen)[: max(1, n // 3)]
    for k, pos in enumerate(where.tolist()):
        flat[pos] = SPECIALS[k % len(SPECIALS)]


def _post(y: torch.Tensor) -> torch.Tensor:
    """A second op fused into the kernel, exact in every dtype."""
    if y.dtype == BOOL:
        return y.logical_not()
    if y.is_floating_point():
        return y * 2
    return y - 3


def _program(case: Case) -> Callable[..., tuple[torch.Tensor, ...]]:
    def program(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pairs = [xs[i : i + case.arity] for i in range(0, len(xs), case.arity)]
        return tuple(_post(case.fn(*p)) for p in pairs)

    return program


def _inputs(case: Case, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    for sa, sb, nc in SHAPES:
        shapes = (sa,) if case.arity == 1 else (sa, sb)
        for k, shape in enumerate(shapes):
            divisor = case.divides and k == 1
            out.append(_draw(shape, dtype, case, gen, nc and len(shape) > 0, divisor))
    return out


def _layouts(xs: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The same values contiguous and spread out (eager's vector and scalar loops; which one an
    element gets also depends on its position in a contiguous tensor)."""
    spread = []
    for x in xs:
        if x.dim() == 0:
            spread.append(x)
            continue
        wide = torch.empty((*x.shape[:-1], x.shape[-1] * 2), dtype=x.dtype)
        spread.append(wide[..., ::2].copy_(x))
    return [[x.contiguous() for x in xs], spread]


def _elementwise_ok(got: torch.Tensor, want: torch.Tensor, exact: bool) -> torch.Tensor:
    """Per element: bitwise for exact ops (a NaN may have other payload bits: 16-bit stores
    write the canonical NaN); else NaN, infinities and zeros (with their sign) exactly and
    finite values within the contract's pointwise budget."""
    if not want.is_floating_point():
        return got == want
    nan = got.isnan() & want.isnan()
    if exact:
        same_bits = torch.signbit(got) == torch.signbit(want)
        return nan | ((got == want) & same_bits)
    tol = plait.contract.load().tolerance("pointwise", want.dtype)
    g, w = got.double(), want.double()
    special = w.isinf() | (w == 0)
    same_special = (g == w) & (torch.signbit(g) == torch.signbit(w))
    close = w.isfinite() & ((g - w).abs() <= tol.atol + tol.rtol * w.abs())
    return nan | torch.where(special, same_special, close & ~g.isnan())


def assert_like_eager(got: torch.Tensor, wants: list[torch.Tensor], exact: bool, what: str) -> None:
    """``got`` against eager's answers on the same values in each layout it was given (eager's
    vector and scalar loops differ on ``fmax(+0, -0)``, say): each element must match one."""
    assert got.dtype == wants[0].dtype and got.shape == wants[0].shape, what
    ok = torch.zeros(got.shape, dtype=torch.bool)
    for want in wants:
        ok |= _elementwise_ok(got, want, exact)
    if not bool(ok.all()):
        at = tuple((~ok).nonzero()[0].tolist())
        seen = [float(w[at]) for w in wants]
        raise AssertionError(f"{what}: at {at}: got {float(got[at])!r}, eager {seen!r}")


def _natively(compiled: Any, op: str, dtype: torch.dtype | None = None) -> None:
    """The manifest's evidence: ``op`` ran in native kernels (float fmod and remainder: ATen
    externs, ``codegen.extern.FLOAT_EXTERNS``), nothing fell back."""
    expected = "native"
    if op in FLOAT_EXTERNS and (dtype is None or dtype.is_floating_point):
        expected = "extern"
    for spec in plait.explain(compiled).specializations:
        manifest = spec.manifest
        assert not manifest.fallbacks, manifest.fallbacks
        evidence = manifest.executor["evidence"]
        assert evidence["counts"]["fallback"] == 0, evidence["counts"]
        ran = [n for n in evidence["nodes"] if n["op"] == op]
        assert ran, f"no {op} node in {[n['op'] for n in evidence['nodes']]}"
        assert {n["executor"] for n in ran} == {expected}, ran


def _params() -> list[Any]:
    out = []
    for n, case in enumerate(CASES):
        for dtype in case.dtypes:
            out.append(pytest.param(case, dtype, id=f"{n}-{case.op}-{str(dtype)[6:]}"))
    return out


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize(("case", "dtype"), _params())
def test_op_compiles_natively_and_matches_eager(case: Case, dtype: torch.dtype) -> None:
    program = _program(case)
    compiled = plait.compile(program, backend="stax")
    gen = torch.Generator().manual_seed(99)
    for draw in range(3):
        xs = _inputs(case, dtype, seed=draw)
        if draw == 2:
            xs = [_with_specials(x, gen) for x in xs]
        with torch.no_grad():
            got = compiled(*xs)
            wants = [program(*xs), *(program(*alt) for alt in _layouts(xs))]
        for k, g in enumerate(got):
            what = f"{case.op} {dtype} output {k} draw {draw}"
            assert_like_eager(g, [w[k] for w in wants], case.exact, what)
    _natively(compiled, case.op, dtype)


# --- the other spellings: aliases, methods, operators, in-place, Python scalars ---------------
def _spellings(x: torch.Tensor, y: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> list[Any]:
    """``x``, ``y`` floats (``y`` positive), ``n``, ``m`` integers (``m`` nonzero)."""
    a = x.clone()
    a.sin_()
    a.fmod_(y)
    b = x.clone()
    b.round_(decimals=1)
    b.remainder_(-1.5)
    c = n.clone()
    c &= m
    c |= 6
    c ^= n
    d = x.clone()
    F.elu(d, inplace=True)
    F.leaky_relu(d, 0.05, inplace=True)
    F.hardswish(d, inplace=True)
    F.threshold(d, 0.2, -1.0, inplace=True)
    e = x.clone()
    F.relu6(e, inplace=True)
    e.nan_to_num_()
    return [
        nn.SELU()(x),
        nn.CELU(0.5)(x),
        nn.Hardsigmoid()(x),
        nn.Mish()(x),
        nn.Softplus()(x),
        nn.LogSigmoid()(x),
        nn.Softsign()(x),
        nn.Tanhshrink()(x),
        nn.ReLU6()(x),
        nn.Hardshrink()(x),
        nn.Softshrink()(x),
        nn.LeakyReLU()(x),
        d,
        e,
        torch.arcsin(x.clamp(-1, 1)),
        torch.arccosh(y + 1),
        torch.arctan2(x, y),
        torch.special.expm1(x),
        torch.special.log1p(y),
        torch.special.exp2(x),
        torch.special.erfc(x),
        torch.special.xlogy(x, y),
        torch.special.round(x * 3),
        torch.fix(x * 3),
        torch.sgn(x),
        x.square(),
        torch.square(n),
        torch.positive(x),
        torch.deg2rad(x),
        x.rad2deg(),
        torch.deg2rad(n),
        x % y,
        x % -2.5,
        3 % y,
        n % m,
        n % 4,
        torch.fmod(n, -3),
        torch.xlogy(2.0, y),
        torch.copysign(x, -1.0),
        x.nan_to_num(posinf=3.0),
        ~n,
        ~(x > 0),
        n & m,
        n | 5,
        3 ^ n,
        (x > 0) ^ (y > 1),
        x.isnan() | x.isinf(),
        a,
        b,
        c,
    ]


@pytest.mark.usefixtures("stax_cache")
def test_every_spelling_compiles_natively_and_matches_eager() -> None:
    compiled = plait.compile(_spellings, backend="stax")
    gen = torch.Generator().manual_seed(5)
    for draw in range(3):
        x = torch.randn(4, 6, generator=gen) * 3
        y = torch.rand(4, 6, generator=gen) * 4 + 0.1
        n = torch.randint(-50, 50, (4, 6), generator=gen)
        sign = torch.randint(0, 2, (4, 6), generator=gen) * 2 - 1
        m = torch.randint(1, 7, (4, 6), generator=gen) * sign
        if draw == 2:
            x = _with_specials(x, gen)
        with torch.no_grad():
            got = compiled(x, y, n, m)
            wants = [_spellings(x, y, n, m), *(_spellings(*alt) for alt in _layouts([x, y, n, m]))]
        for k, g in enumerate(got):
            assert_like_eager(g, [w[k] for w in wants], False, f"spelling {k} draw {draw}")
    manifest = plait.explain(compiled).specializations[0].manifest
    assert not manifest.fallbacks, manifest.fallbacks
    assert manifest.executor["evidence"]["counts"]["fallback"] == 0


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("op", ["fmod", "remainder"])
def test_integer_division_by_zero_raises_as_eager(op: str) -> None:
    fn = getattr(torch, op)

    def program(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fn(a, b) + 1

    compiled = plait.compile(program, backend="stax")
    a, b = torch.tensor([5, -7, 9]), torch.tensor([2, 3, -4])
    assert_bitwise(compiled(a, b), program(a, b), op)
    zero = torch.tensor([2, 0, -4])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        program(a, zero)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, zero)


def test_round_half_to_even_and_python_remainder_sign() -> None:
    """The two semantics most often got wrong, on values that decide them."""
    halves = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5])
    compiled = plait.compile(lambda t: torch.round(t) + 0.0, backend="stax")
    assert compiled(halves).tolist() == [-2.0, -2.0, 0.0, 0.0, 2.0, 2.0, 4.0]
    a = torch.tensor([5.0, -5.0, 5.0, -5.0, 0.0, -0.0])
    b = torch.tensor([3.0, 3.0, -3.0, -3.0, -3.0, 3.0])
    rem = plait.compile(lambda p, q: torch.remainder(p, q) * 1, backend="stax")
    assert_bitwise(rem(a, b), torch.remainder(a, b))
    assert rem(a, b)[:4].tolist() == [2.0, 1.0, -1.0, -2.0]

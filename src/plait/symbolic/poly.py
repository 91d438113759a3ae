"""Sizes as integer polynomials over size atoms: the form codegen computes with.

A :class:`Poly` is a *non-constant* polynomial with integer coefficients over atoms. An atom is a
size symbol (``s0``, ``batch``) or a size expression that is no such polynomial
(``floor(s0/2)``, named ``f_<digest>`` after its text). Constants are plain ints: arithmetic on
Polys returns an ``int`` whenever its result is constant, so ``isinstance(x, int)`` tells a static
size from a symbolic one, and a static program never meets a Poly.

Comparisons are proofs, never guesses: :func:`nonneg`, :func:`le`, :func:`lt` return True only
when the relation holds for every value of the atoms allowed by their lower bounds (a symbol is
at least 1; an unbacked size or a compound atom sympy knows to be nonnegative at least 0; other
atoms have no bound). ``Poly`` itself refuses ``<``, ``bool()`` and ``int()``: code that would
decide on a symbolic size has to say how (prove it, or take the size at run time).

Example:
    >>> from plait.symbolic import symbol
    >>> s0, s1 = from_dim(symbol("s0")), from_dim(symbol("s1"))
    >>> str(3 * s0 * s1 + s0 - 1)
    '3*s0*s1 + s0 - 1'
    >>> (s0 + 1) - s0
    1
    >>> lt(s1 - 1, s1), nonneg(s1 - 2), exact_quotient(6 * s0 * s1, 2 * s1)
    (True, False, 3*s0)
    >>> evaluate(3 * s0 * s1 + 1, {"s0": 2, "s1": 5})
    31
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import sympy

from plait.symbolic.dims import SymbolicSizeError

Monomial = tuple[str, ...]  # atom names, sorted, with repeats for powers; () is the constant


class Poly:
    """A non-constant integer polynomial over size atoms (construct through :func:`from_dim`,
    :func:`atom` and arithmetic; a constant result is an ``int``)."""

    __slots__ = ("_hash", "_text", "terms")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]) -> None:
        self.terms = terms
        self._hash = hash(terms)
        self._text: str | None = None  # NOTE: to_text(self), made when first asked for

    # --- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other: Size) -> Size:
        if isinstance(other, int):
            return _make(_add(dict(self.terms), (((), other),))) if other else self
        if isinstance(other, Poly):
            return _make(_add(dict(self.terms), other.terms))
        return NotImplemented

    __radd__ = __add__

    def __neg__(self) -> Size:
        return _make({m: -c for m, c in self.terms})

    def __sub__(self, other: Size) -> Size:
        if isinstance(other, (int, Poly)):
            return self + (-other)
        return NotImplemented

    def __rsub__(self, other: Size) -> Size:
        if isinstance(other, int):
            return (-self) + other
        return NotImplemented

    def __mul__(self, other: Size) -> Size:
        if isinstance(other, int):
            if other == 0:
                return 0
            return self if other == 1 else _make({m: c * other for m, c in self.terms})
        if isinstance(other, Poly):
            out: dict[Monomial, int] = {}
            for ma, ca in self.terms:
                for mb, cb in other.terms:
                    m = tuple(sorted(ma + mb))
                    out[m] = out.get(m, 0) + ca * cb
            return _make(out)
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, other: Size) -> Size:
        q = exact_quotient(self, other)
        if q is None:
            raise SymbolicSizeError(f"symbolic size {self} is not a known multiple of {other}")
        return q

    # --- identity -----------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        # NOTE: structural: a Poly is never equal to an int (it is not constant)
        return isinstance(other, Poly) and self.terms == other.terms

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        raise SymbolicSizeError(f"the truth of symbolic size {self} is decided at run time")

    def __int__(self) -> int:
        raise SymbolicSizeError(f"symbolic size {self} has no value before a call binds it")

    __index__ = __int__

    def __lt__(self, other: object) -> bool:
        raise SymbolicSizeError(
            f"symbolic size {self} compared with <: prove it (plait.symbolic.poly.lt)"
        )

    __le__ = __gt__ = __ge__ = __lt__

    def __str__(self) -> str:
        # NOTE: immutable: an index's sort key prints its sizes again and again
        if self._text is None:
            self._text = to_text(self)
        return self._text

    __repr__ = __str__

    # --- queries ------------------------------------------------------------------------------
    def atoms(self) -> set[str]:
        return {a for m, _ in self.terms for a in m}


Size: TypeAlias = int | Poly


def _add(terms: dict[Monomial, int], more: Iterable[tuple[Monomial, int]]) -> dict[Monomial, int]:
    for m, c in more:
        terms[m] = terms.get(m, 0) + c
    return terms


def _make(terms: Mapping[Monomial, int]) -> Size:
    items = tuple(sorted((m, c) for m, c in terms.items() if c))
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    return Poly(items)


# --- atoms --------------------------------------------------------------------------------------
# NOTE: process-wide and keyed by name: a symbol's name fixes its assumptions (plait.symbolic
# makes positive ones, and nonnegative unbacked ``dd<k>``), and a compound atom's name is the
# digest of its text, so one name always means one expression.
_LOWER: dict[str, int | None] = {}
_COMPOUND: dict[str, sympy.Expr] = {}


def atom(name: str, lower: int | None = 1) -> Poly:
    """The size atom ``name`` (a symbol) with lower bound ``lower`` (None: unknown)."""
    _LOWER.setdefault(name, lower)
    return Poly(((((name,), 1)),))


def compound(name: str) -> sympy.Expr | None:
    """The sympy expression a compound atom stands for (None for a symbol)."""
    return _COMPOUND.get(name)


def _compound_atom(expr: sympy.Expr) -> Poly:
    text = sympy.srepr(expr)
    name = "f_" + hashlib.sha256(text.encode()).hexdigest()[:12]
    _COMPOUND.setdefault(name, expr)
    lower = 0 if expr.is_nonnegative else None
    return atom(name, lower)


def from_dim(d: Any) -> Size:
    """An IR dim (``int`` or sympy expression) as a :data:`Size`."""
    if isinstance(d, bool):
        raise SymbolicSizeError("a size cannot be a bool")
    if isinstance(d, int):
        return d
    if isinstance(d, Poly):
        return d
    if not isinstance(d, sympy.Expr):
        raise SymbolicSizeError(f"not a size: {d!r}")
    if d.is_Integer:
        return int(d)
    if d.is_Symbol:
        lower = 1 if d.is_positive else 0 if d.is_nonnegative else None
        return atom(str(d), lower)
    if d.is_Add:
        out: Size = 0
        for a in d.args:
            out = out + from_dim(a)
        return out
    if d.is_Mul and all(a.is_Integer or not a.is_number for a in d.args):
        prod: Size = 1
        for a in d.args:
            prod = prod * from_dim(a)
        return prod
    if d.is_Pow and d.exp.is_Integer and int(d.exp) > 0:
        base = from_dim(d.base)
        power: Size = 1
        for _ in range(int(d.exp)):
            power = power * base
        return power
    return _compound_atom(d)


def to_dim(x: Size) -> Any:
    """A :data:`Size` as a sympy expression (an ``int`` when static)."""
    if isinstance(x, int):
        return x
    out = sympy.Integer(0)
    for m, c in x.terms:
        term: sympy.Expr = sympy.Integer(c)
        for a in m:
            term = term * _atom_expr(a)
        out = out + term
    return out


def _atom_expr(name: str) -> sympy.Expr:
    hit = _COMPOUND.get(name)
    if hit is not None:
        return hit
    lower = _LOWER.get(name)
    if lower == 1:
        return sympy.Symbol(name, integer=True, positive=True)
    if lower == 0:
        return sympy.Symbol(name, integer=True, nonnegative=True)
    return sympy.Symbol(name, integer=True)


# --- text ---------------------------------------------------------------------------------------
def to_text(x: Size, name: Any = None) -> str:
    """``x`` as text; ``name`` maps an atom name to how it is spelled (C++ or Python code)."""
    if isinstance(x, int):
        return str(x)
    parts: list[str] = []
    for m, c in sorted(x.terms, key=lambda t: (-len(t[0]), t[0])):
        factors = [name(a) if name else a for a in m]
        if not factors:
            text = str(abs(c))
        elif abs(c) == 1:
            text = "*".join(factors)
        else:
            text = "*".join([str(abs(c)), *factors])
        if not parts:
            parts.append(text if c > 0 else f"-{text}")
        else:
            parts.append(f"{'+' if c > 0 else '-'} {text}")
    return " ".join(parts)


# --- proofs -------------------------------------------------------------------------------------
def atom_lower_bound(name: str) -> int | None:
    """The lower bound size atom ``name`` was made with (None: unknown)."""
    return _LOWER.get(name)


def lower_bound(
    x: Size | None, atom_bound: Callable[[str], int | None] = atom_lower_bound
) -> int | None:
    """A proven lower bound of ``x`` (None: none known): its value at the atoms' lower bounds
    (``atom_bound``'s, by name) when no coefficient of a non-constant term is negative."""
    if x is None:
        return None
    if isinstance(x, int):
        return x
    value = 0
    for m, c in x.terms:
        if not m:
            value += c
            continue
        if c < 0:
            return None
        term = c
        for a in m:
            lo = atom_bound(a)
            if lo is None:
                return None
            term *= lo
        value += term
    return value


def nonneg(x: Size | None) -> bool:
    """Proven ``x >= 0``."""
    if isinstance(x, int):
        return x >= 0
    lo = lower_bound(x)
    return lo is not None and lo >= 0


def le(a: Size | None, b: Size | None) -> bool:
    """Proven ``a <= b``."""
    if a is None or b is None:
        return False
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return nonneg(b - a)


def lt(a: Size | None, b: Size | None) -> bool:
    """Proven ``a < b``."""
    if a is None or b is None:
        return False
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    return nonneg(b - a - 1)


def is_zero(x: Size) -> bool:
    return isinstance(x, int) and x == 0


def exact_quotient(a: Size, k: Size) -> Size | None:
    """``a / k`` when ``a`` is a known multiple of ``k`` (for every value of the atoms), else
    None."""
    if isinstance(k, int):
        if k == 0:
            return None
        if isinstance(a, int):
            return a // k if a % k == 0 else None
        if any(c % k for _, c in a.terms):
            return None
        return _make({m: c // k for m, c in a.terms})
    if isinstance(a, int):
        return 0 if a == 0 else None
    if len(k.terms) == 1:
        ((km, kc),) = k.terms
        out: dict[Monomial, int] = {}
        for m, c in a.terms:
            rest = _monomial_quotient(m, km)
            if rest is None or c % kc:
                return None
            out[rest] = c // kc
        return _make(out)
    lead_a = max(a.terms, key=lambda t: (len(t[0]), t[0]))
    lead_k = max(k.terms, key=lambda t: (len(t[0]), t[0]))
    rest = _monomial_quotient(lead_a[0], lead_k[0])
    if rest is None or lead_a[1] % lead_k[1]:
        return None
    q = _make({rest: lead_a[1] // lead_k[1]})
    return q if q * k == a else None


def _monomial_quotient(m: Monomial, k: Monomial) -> Monomial | None:
    left = list(m)
    for a in k:
        if a not in left:
            return None
        left.remove(a)
    return tuple(left)


# --- values -------------------------------------------------------------------------------------
def evaluate(x: Size, values: Mapping[str, int]) -> int:
    """``x`` at the atom values ``values`` (by atom name)."""
    if isinstance(x, int):
        return x
    total = 0
    for m, c in x.terms:
        term = c
        for a in m:
            term *= values[a]
        total += term
    return total


def hint(x: Size, default: int = 64) -> int:
    """A representative value of ``x`` (every atom at ``default``): for orderings that only
    decide speed, never correctness."""
    if isinstance(x, int):
        return x
    return evaluate(x, {a: default for a in x.atoms()})


def atoms_of(sizes: Iterable[Size]) -> set[str]:
    out: set[str] = set()
    for s in sizes:
        if isinstance(s, Poly):
            out |= s.atoms()
    return out

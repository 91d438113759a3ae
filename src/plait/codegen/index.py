"""Index expressions over loop variables: affine sums with floor-division, modulo and clamp atoms.

Every element access in a kernel is an :class:`Ix`: ``const + sum(coef * atom)``. Views (permute,
expand, slice, reshape, ...) become index arithmetic on these, never copies. Simplification is
exact integer algebra with value ranges: ``(k*q + r) // k == q`` and ``(k*q + r) % k == r`` when
``0 <= r < k``, and ``c*k*(e // k) + c*(e % k) == c*e``; so a reshape that splits or merges
contiguous dims folds back into plain strides.

NOTE: loop variables and every index are nonnegative; an atom's operand may be negative only
inside a :class:`Clamp` (``cat`` shifts an index by its piece's offset and clamps it in range).
A sum may still have negative parts (``flip`` maps ``i`` to ``n-1-i``): division and modulo
split off a multiple of the divisor only when the remainder part cannot be negative.

Example:
    >>> i = Ix.var(Var("i0", 12))
    >>> str(i.div(4) * 4 + i.mod(4))
    'i0'
    >>> str((i * 3 + 2).div(3))
    'i0'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class Var:
    """A loop variable with extent ``extent`` (values ``0 .. extent-1``)."""

    name: str
    extent: int

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Div:
    e: Ix
    k: int

    def __str__(self) -> str:
        return f"({self.e} / {self.k})"


@dataclass(frozen=True)
class Mod:
    e: Ix
    k: int

    def __str__(self) -> str:
        return f"({self.e} % {self.k})"


@dataclass(frozen=True)
class Clamp:
    e: Ix
    lo: int
    hi: int

    def __str__(self) -> str:
        return f"clamp({self.e}, {self.lo}, {self.hi})"


Atom = Var | Div | Mod | Clamp


def _key(atom: Atom) -> str:
    return f"{type(atom).__name__}:{atom}"


@dataclass(frozen=True)
class Ix:
    """``const + sum(coef * atom)``; terms sorted by atom text, no zero coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0
    _hash: int = field(default=0, compare=False, repr=False)

    # --- construction -------------------------------------------------------------------------
    @staticmethod
    def var(v: Var) -> Ix:
        return Ix.of({v: 1}, 0)

    @staticmethod
    def lit(c: int) -> Ix:
        return Ix((), int(c))

    @staticmethod
    def of(terms: Mapping[Atom, int], const: int) -> Ix:
        return _normalize(dict(terms), const)

    # --- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other: Ix | int) -> Ix:
        if isinstance(other, int):
            return Ix(self.terms, self.const + other) if other else self
        terms = dict(self.terms)
        for a, c in other.terms:
            terms[a] = terms.get(a, 0) + c
        return _normalize(terms, self.const + other.const)

    def __radd__(self, other: int) -> Ix:
        return self + other

    def __sub__(self, other: Ix | int) -> Ix:
        return self + (-other if isinstance(other, int) else other * -1)

    def __mul__(self, k: int) -> Ix:
        if k == 0:
            return Ix.lit(0)
        if k == 1:
            return self
        return Ix(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def div(self, k: int) -> Ix:
        """Floor division by a positive constant."""
        if k <= 0:
            raise ValueError(f"index division by {k}: a divisor is a positive extent")
        if k == 1:
            return self
        quotient, rest = self._split(k)
        lo, hi = rest.range
        if lo >= 0 and hi < k:
            return quotient
        if rest.is_const:
            return quotient + rest.const // k
        if lo < 0:
            # NOTE: C++ division truncates: only a nonnegative operand floors. The whole index
            # is nonnegative (an index), its remainder part need not be (flip, pad).
            return Ix.of({Div(self, k): 1}, 0)
        for c, inner, _low in rest._factor(k):
            return quotient + inner.div(k // c)
        return quotient + Ix.of({Div(rest, k): 1}, 0)

    def mod(self, k: int) -> Ix:
        """Modulo a positive constant (the operand is nonnegative)."""
        if k <= 0:
            raise ValueError(f"index modulo {k}: a modulus is a positive extent")
        if k == 1:
            return Ix.lit(0)
        _, rest = self._split(k)
        lo, hi = rest.range
        if lo >= 0 and hi < k:
            return rest
        if rest.is_const:
            return Ix.lit(rest.const % k)
        if lo < 0:
            return Ix.of({Mod(self, k): 1}, 0)  # NOTE: as in div: C++ % of a negative is negative
        for c, inner, low in rest._factor(k):
            return inner.mod(k // c) * c + low
        return Ix.of({Mod(rest, k): 1}, 0)

    def clamp(self, lo: int, hi: int) -> Ix:
        a, b = self.range
        if a >= lo and b <= hi:
            return self
        if b <= lo or a >= hi:
            return Ix.lit(lo if b <= lo else hi)
        if self.is_const:
            return Ix.lit(min(max(self.const, lo), hi))
        return Ix.of({Clamp(self, lo, hi): 1}, 0)

    def _factor(self, k: int) -> list[tuple[int, Ix, Ix]]:
        """``self == c * inner + low`` with ``0 <= low < c`` and ``c`` a proper divisor of k:
        then ``self // k == inner // (k/c)``; at most one (the largest such c)."""
        for c in sorted({c for _, c in self.terms if 1 < c < k and k % c == 0}, reverse=True):
            inner, low = self._split(c)
            lo, hi = low.range
            if lo >= 0 and hi < c:
                return [(c, inner, low)]
        return []

    def _split(self, k: int) -> tuple[Ix, Ix]:
        """``self == k * quotient + rest`` with every coefficient of ``rest`` not divisible by k."""
        q: dict[Atom, int] = {}
        r: dict[Atom, int] = {}
        for a, c in self.terms:
            if c % k == 0:
                q[a] = c // k
            else:
                r[a] = c
        qc, rc = divmod(self.const, k) if self.const >= 0 else (0, self.const)
        return _normalize(q, qc), _normalize(r, rc)

    # --- queries ------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    @cached_property
    def range(self) -> tuple[int, int]:
        lo = hi = self.const
        for a, c in self.terms:
            alo, ahi = atom_range(a)
            if c >= 0:
                lo, hi = lo + c * alo, hi + c * ahi
            else:
                lo, hi = lo + c * ahi, hi + c * alo
        return lo, hi

    def vars(self) -> set[Var]:
        out: set[Var] = set()
        for a, _ in self.terms:
            if isinstance(a, Var):
                out.add(a)
            else:
                out |= a.e.vars()
        return out

    def has_divmod(self) -> bool:
        return any(not isinstance(a, Var) for a, _ in self.terms)

    def coef(self, v: Var) -> int | None:
        """The coefficient of ``v`` when it occurs only linearly (None when inside an atom)."""
        for a, _ in self.terms:
            if not isinstance(a, Var) and v in a.e.vars():
                return None
        return dict(self.terms).get(v, 0)

    def subs(self, mapping: Mapping[Var, Ix]) -> Ix:
        out = Ix.lit(self.const)
        for a, c in self.terms:
            if isinstance(a, Var):
                out = out + (mapping[a] if a in mapping else Ix.var(a)) * c
            elif isinstance(a, Div):
                out = out + a.e.subs(mapping).div(a.k) * c
            elif isinstance(a, Mod):
                out = out + a.e.subs(mapping).mod(a.k) * c
            else:
                out = out + a.e.subs(mapping).clamp(a.lo, a.hi) * c
        return out

    def __str__(self) -> str:
        parts = [str(a) if c == 1 else f"{a}*{c}" for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    def __hash__(self) -> int:
        return hash((self.terms, self.const))


def atom_range(a: Atom) -> tuple[int, int]:
    if isinstance(a, Var):
        return 0, max(a.extent - 1, 0)
    lo, hi = a.e.range
    if isinstance(a, Div):
        return lo // a.k, hi // a.k
    if isinstance(a, Mod):
        return 0, min(a.k - 1, max(hi, 0))
    return max(lo, a.lo), min(hi, a.hi)


def _normalize(terms: dict[Atom, int], const: int) -> Ix:
    """Drop zero terms, fold ``c*k*(e // k) + c*(e % k)`` into ``c*e``, sort."""
    changed = True
    while changed:
        changed = False
        for a, c in list(terms.items()):
            if not isinstance(a, Div) or c == 0:
                continue
            partner = Mod(a.e, a.k)
            pc = terms.get(partner, 0)
            if pc and c == pc * a.k:
                del terms[a], terms[partner]
                for b, bc in a.e.terms:
                    terms[b] = terms.get(b, 0) + bc * pc
                const += a.e.const * pc
                changed = True
                break
    items = tuple(sorted(((a, c) for a, c in terms.items() if c), key=lambda t: _key(t[0])))
    return Ix(items, const)


def linear(index: tuple[Ix, ...], strides: tuple[int, ...], offset: int = 0) -> Ix:
    """The element offset of ``index`` in a buffer with ``strides`` (elements) and ``offset``."""
    out = Ix.lit(offset)
    for i, s in zip(index, strides):
        out = out + i * s
    return out


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def ravel(index: tuple[Ix, ...], shape: tuple[int, ...]) -> Ix:
    """The row-major linear position of ``index`` in ``shape``."""
    return linear(index, contiguous_strides(shape))


def unravel(lin: Ix, shape: tuple[int, ...]) -> tuple[Ix, ...]:
    """The index in ``shape`` of row-major linear position ``lin``.

    NOTE: a shape with a zero dim has no positions: the index is never evaluated, and a zero
    extent is taken as 1 (no modulo by zero), as :func:`contiguous_strides` takes it."""
    strides = contiguous_strides(shape)
    return tuple(
        lin.div(s).mod(max(d, 1)) if i else lin.div(s)
        for i, (s, d) in enumerate(zip(strides, shape))
    )

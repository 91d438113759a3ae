"""Index expressions over loop variables: affine sums with floor-division, modulo and clamp atoms.

Every element access in a kernel is an :class:`Ix`: ``const + sum(coef * atom)``. Views (permute,
expand, slice, reshape, ...) become index arithmetic on these, never copies. Simplification is
exact integer algebra with value ranges: ``(k*q + r) // k == q`` and ``(k*q + r) % k == r`` when
``0 <= r < k``, and ``c*k*(e // k) + c*(e % k) == c*e``; so a reshape that splits or merges
contiguous dims folds back into plain strides.

Sizes (extents, coefficients, divisors, clamp bounds) are ints, or with symbolic shapes
:class:`~plait.symbolic.poly.Poly` sizes: every simplification then needs a proof
(:func:`~plait.symbolic.poly.lt` and friends) and is skipped, keeping the div/mod atom, when
there is none. A static kernel never meets a Poly and simplifies exactly as before.

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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from plait.errors import InternalValueError
from plait.symbolic.poly import Poly, Size, exact_quotient, hint, is_zero, le, lt, nonneg


@dataclass(frozen=True)
class Var:
    """A loop variable with extent ``extent`` (values ``0 .. extent-1``)."""

    name: str
    extent: Size

    def __str__(self) -> str:
        return self.name


def _s(x: Size) -> str:
    """A size as an operand in text: a symbolic sum is parenthesized."""
    return str(x) if isinstance(x, int) or len(x.terms) == 1 else f"({x})"


# NOTE: index values are immutable: each caches its text and hash (cached_property writes the
# instance dict, past the frozen dataclass's __setattr__), which sorting and dict lookups ask for
# again and again; without the caches a symbolic kernel's loop merging took minutes.
@dataclass(frozen=True)
class Div:
    e: Ix
    k: Size

    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:
        return f"({self.e} / {_s(self.k)})"

    def __hash__(self) -> int:
        return self._hashed

    @cached_property
    def _hashed(self) -> int:
        return hash((self.e, self.k))  # NOTE: the value the dataclass gave


@dataclass(frozen=True)
class Mod:
    e: Ix
    k: Size

    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:
        return f"({self.e} % {_s(self.k)})"

    def __hash__(self) -> int:
        return self._hashed

    @cached_property
    def _hashed(self) -> int:
        return hash((self.e, self.k))


@dataclass(frozen=True)
class Clamp:
    e: Ix
    lo: Size
    hi: Size

    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:
        return f"clamp({self.e}, {self.lo}, {self.hi})"

    def __hash__(self) -> int:
        return self._hashed

    @cached_property
    def _hashed(self) -> int:
        return hash((self.e, self.lo, self.hi))


Atom = Var | Div | Mod | Clamp


def _key(atom: Atom) -> str:
    return f"{type(atom).__name__}:{atom}"


@dataclass(frozen=True)
class Ix:
    """``const + sum(coef * atom)``; terms sorted by atom text, no zero coefficients."""

    terms: tuple[tuple[Atom, Size], ...] = ()
    const: Size = 0
    _hash: int = field(default=0, compare=False, repr=False)

    # --- construction -------------------------------------------------------------------------
    @staticmethod
    def var(v: Var) -> Ix:
        return Ix.of({v: 1}, 0)

    @staticmethod
    def lit(c: Size) -> Ix:
        return Ix((), c if isinstance(c, Poly) else int(c))

    @staticmethod
    def of(terms: Mapping[Atom, Size], const: Size) -> Ix:
        return _normalize(dict(terms), const)

    # --- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other: Ix | Size) -> Ix:
        if not isinstance(other, Ix):
            return self if is_zero(other) else Ix(self.terms, self.const + other)
        terms = dict(self.terms)
        for a, c in other.terms:
            terms[a] = terms.get(a, 0) + c
        return _normalize(terms, self.const + other.const)

    def __radd__(self, other: Size) -> Ix:
        return self + other

    def __sub__(self, other: Ix | Size) -> Ix:
        return self + (other * -1 if isinstance(other, Ix) else -other)

    def __mul__(self, k: Size) -> Ix:
        if is_zero(k):
            return Ix.lit(0)
        if k == 1:
            return self
        return Ix(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def div(self, k: Size) -> Ix:
        """Floor division by a positive extent."""
        if isinstance(k, int) and k <= 0:
            raise InternalValueError(f"index division by {k}: a divisor is a positive extent")
        if k == 1:
            return self
        quotient, rest = self._split(k)
        lo, hi = rest.range
        if nonneg(lo) and lt(hi, k):
            return quotient
        if rest.is_const and isinstance(rest.const, int) and isinstance(k, int):
            return quotient + rest.const // k
        if not nonneg(lo):
            # NOTE: C++ division truncates: only a nonnegative operand floors. The whole index
            # is nonnegative (an index), its remainder part need not be (flip, pad).
            return Ix.of({Div(self, k): 1}, 0)
        for c, inner, _low in rest._factor(k):
            return quotient + inner.div(_quotient(k, c))
        return quotient + Ix.of({Div(rest, k): 1}, 0)

    def mod(self, k: Size) -> Ix:
        """Modulo a positive extent (the operand is nonnegative)."""
        if isinstance(k, int) and k <= 0:
            raise InternalValueError(f"index modulo {k}: a modulus is a positive extent")
        if k == 1:
            return Ix.lit(0)
        _, rest = self._split(k)
        lo, hi = rest.range
        if nonneg(lo) and lt(hi, k):
            return rest
        if rest.is_const and isinstance(rest.const, int) and isinstance(k, int):
            return Ix.lit(rest.const % k)
        if not nonneg(lo):
            return Ix.of({Mod(self, k): 1}, 0)  # NOTE: as in div: C++ % of a negative is negative
        for c, inner, low in rest._factor(k):
            return inner.mod(_quotient(k, c)) * c + low
        return Ix.of({Mod(rest, k): 1}, 0)

    def clamp(self, lo: Size, hi: Size) -> Ix:
        a, b = self.range
        if le(lo, a) and le(b, hi):
            return self
        if le(b, lo) or le(hi, a):
            return Ix.lit(lo if le(b, lo) else hi)
        c = self.const
        if self.is_const and isinstance(c, int) and isinstance(lo, int) and isinstance(hi, int):
            return Ix.lit(min(max(c, lo), hi))
        return Ix.of({Clamp(self, lo, hi): 1}, 0)

    def _factor(self, k: Size) -> list[tuple[Size, Ix, Ix]]:
        """``self == c * inner + low`` with ``0 <= low < c`` and ``c`` a proper divisor of k:
        then ``self // k == inner // (k/c)``; at most one (the largest such c)."""
        candidates = {c for _, c in self.terms if _proper_divisor(c, k)}
        for c in sorted(candidates, key=_order_key, reverse=True):
            inner, low = self._split(c)
            lo, hi = low.range
            if nonneg(lo) and lt(hi, c):
                return [(c, inner, low)]
        return []

    def _split(self, k: Size) -> tuple[Ix, Ix]:
        """``self == k * quotient + rest`` with every coefficient of ``rest`` not divisible by k."""
        q: dict[Atom, Size] = {}
        r: dict[Atom, Size] = {}
        for a, c in self.terms:
            qa = exact_quotient(c, k)
            if qa is not None:
                q[a] = qa
            else:
                r[a] = c
        const = self.const
        qc: Size
        rc: Size
        if isinstance(const, int) and isinstance(k, int):
            qc, rc = divmod(const, k) if const >= 0 else (0, const)
        else:
            whole = exact_quotient(const, k)
            qc, rc = (whole, 0) if whole is not None else (0, const)
        return _normalize(q, qc), _normalize(r, rc)

    # --- queries ------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return not self.terms

    @cached_property
    def range(self) -> tuple[Size | None, Size | None]:
        """Proven bounds ``(lo, hi)`` of the index; None where no bound is known (symbolic)."""
        lo: Size | None = self.const
        hi: Size | None = self.const
        for a, c in self.terms:
            alo, ahi = atom_range(a)
            if nonneg(c):
                lo, hi = _plus(lo, c, alo), _plus(hi, c, ahi)
            elif nonneg(-c):
                lo, hi = _plus(lo, c, ahi), _plus(hi, c, alo)
            else:
                lo = hi = None
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

    def coef(self, v: Var) -> Size | None:
        """The coefficient of ``v`` when it occurs only linearly (None when inside an atom)."""
        for a, _ in self.terms:
            if not isinstance(a, Var) and v in a.e.vars():
                return None
        return dict(self.terms).get(v, 0)

    def subs(self, mapping: Mapping[Var, Ix], _done: dict[Ix, Ix] | None = None) -> Ix:
        # NOTE: the pieces summed first and normalized once (a normalization per piece made
        # the printer's loop merging quadratic in the terms); ``_done`` holds each operand
        # already substituted in this call (a div and a mod of one operand share it)
        done: dict[Ix, Ix] = {} if _done is None else _done
        hit = done.get(self)
        if hit is not None:
            return hit
        terms: dict[Atom, Size] = {}
        const: Size = self.const
        for a, c in self.terms:
            if isinstance(a, Var):
                if a not in mapping:
                    terms[a] = terms.get(a, 0) + c
                    continue
                piece = mapping[a]
            elif isinstance(a, Div):
                piece = a.e.subs(mapping, done).div(a.k)
            elif isinstance(a, Mod):
                piece = a.e.subs(mapping, done).mod(a.k)
            else:
                piece = a.e.subs(mapping, done).clamp(a.lo, a.hi)
            for b, bc in piece.terms:
                terms[b] = terms.get(b, 0) + bc * c
            const = const + piece.const * c
        out = done[self] = _normalize(terms, const)
        return out

    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:
        parts = [str(a) if c == 1 else f"{a}*{_s(c)}" for a, c in self.terms]
        if not is_zero(self.const) or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)

    def __hash__(self) -> int:
        return self._hashed

    @cached_property
    def _hashed(self) -> int:
        return hash((self.terms, self.const))


def atom_range(a: Atom) -> tuple[Size | None, Size | None]:
    if isinstance(a, Var):
        # NOTE: a symbolic extent may be 0 at run time: the loop then never runs, any bound holds
        return 0, max(a.extent - 1, 0) if isinstance(a.extent, int) else a.extent - 1
    lo, hi = a.e.range
    if isinstance(a, Div):
        return _div_low(lo, a.k), _div_high(hi, a.k)
    if isinstance(a, Mod):
        if isinstance(hi, int) and isinstance(a.k, int):
            return 0, min(a.k - 1, max(hi, 0))
        return 0, hi if nonneg(hi) and le(hi, a.k - 1) else a.k - 1
    if all(isinstance(x, int) for x in (lo, hi, a.lo, a.hi)):
        return max(lo, a.lo), min(hi, a.hi)  # type: ignore[type-var]
    return (lo if le(a.lo, lo) else a.lo), (hi if le(hi, a.hi) else a.hi)


def _plus(acc: Size | None, c: Size, bound: Size | None) -> Size | None:
    if acc is None or bound is None:
        return None
    return acc + c * bound


def _div_low(lo: Size | None, k: Size) -> Size | None:
    if isinstance(lo, int) and isinstance(k, int):
        return lo // k
    if lo is None:
        return None
    q = exact_quotient(lo, k)
    if q is not None:
        return q
    return 0 if nonneg(lo) else None


def _div_high(hi: Size | None, k: Size) -> Size | None:
    if isinstance(hi, int) and isinstance(k, int):
        return hi // k
    if hi is None:
        return None
    q = exact_quotient(hi + 1, k)
    if q is not None:
        return q - 1
    q = exact_quotient(hi, k)
    if q is not None:
        return q
    return hi if nonneg(hi) else None


def _quotient(k: Size, c: Size) -> Size:
    q = exact_quotient(k, c)
    assert q is not None, (k, c)
    return q


def _proper_divisor(c: Size, k: Size) -> bool:
    """``c`` divides ``k`` and ``1 < c < k`` (symbolic: ``c`` and ``k / c`` are positive sizes
    other than 1)."""
    if isinstance(c, int) and isinstance(k, int):
        return 1 < c < k and k % c == 0
    q = exact_quotient(k, c)
    if q is None or c == 1 or q == 1:
        return False
    return lt(0, c) and lt(0, q) and (isinstance(c, Poly) or c > 1)


def _order_key(c: Size) -> tuple[int, str]:
    return hint(c), str(c)


def nonzero(d: Size) -> Size:
    """A divisor that is safe to print: ``max(d, 1)`` for a static size; a symbolic one as is
    (the printer guards one that may be 0 at run time)."""
    return max(d, 1) if isinstance(d, int) else d


def _normalize(terms: dict[Atom, Size], const: Size) -> Ix:
    """Drop zero terms, fold ``c*k*(e // k) + c*(e % k)`` into ``c*e``, sort."""
    changed = True
    while changed:
        changed = False
        for a, c in list(terms.items()):
            if not isinstance(a, Div) or is_zero(c):
                continue
            partner = Mod(a.e, a.k)
            pc = terms.get(partner, 0)
            if not is_zero(pc) and c == pc * a.k:
                del terms[a], terms[partner]
                for b, bc in a.e.terms:
                    terms[b] = terms.get(b, 0) + bc * pc
                const += a.e.const * pc
                changed = True
                break
    items = tuple(
        sorted(((a, c) for a, c in terms.items() if not is_zero(c)), key=lambda t: _key(t[0]))
    )
    return Ix(items, const)


def linear(index: tuple[Ix, ...], strides: tuple[Size, ...], offset: Size = 0) -> Ix:
    """The element offset of ``index`` in a buffer with ``strides`` (elements) and ``offset``."""
    out = Ix.lit(offset)
    for i, s in zip(index, strides):
        out = out + i * s
    return out


def contiguous_strides(shape: tuple[Size, ...]) -> tuple[Size, ...]:
    strides: list[Size] = []
    acc: Size = 1
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * nonzero(d)
    return tuple(reversed(strides))


def ravel(index: tuple[Ix, ...], shape: tuple[Size, ...]) -> Ix:
    """The row-major linear position of ``index`` in ``shape``."""
    return linear(index, contiguous_strides(shape))


def unravel(lin: Ix, shape: tuple[Size, ...]) -> tuple[Ix, ...]:
    """The index in ``shape`` of row-major linear position ``lin``.

    NOTE: a shape with a zero dim has no positions: the index is never evaluated, and a zero
    extent is taken as 1 (no modulo by zero), as :func:`contiguous_strides` takes it."""
    strides = contiguous_strides(shape)
    return tuple(
        lin.div(s).mod(nonzero(d)) if i else lin.div(s)
        for i, (s, d) in enumerate(zip(strides, shape))
    )


def index_bound(ix: Ix, static: Callable[[Size], int]) -> int:
    """An upper bound of |value| of ``ix`` and of every partial sum computed on the way, for a
    printer of static kernels: ``static`` turns each size into an int (or refuses a symbolic
    one with the printer's own error)."""
    total = abs(static(ix.const))
    inner = 0
    for atom, coef in ix.terms:
        lo, hi = atom_range(atom)
        bounds = [abs(static(x)) for x in (lo, hi) if x is not None]
        total += abs(static(coef)) * max([*bounds, 1])
        if not isinstance(atom, Var):
            inner = max(inner, index_bound(atom.e, static))
    return max(total, inner)

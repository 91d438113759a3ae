"""The size comparisons of a symbolic program as guards: simplified, deduplicated, each stated
as the relation that must hold.

Capture records each comparison the program made on a size and its outcome (``t > 64``:
False). A comparison of static dims is implied by the type guard and kept as captured. Those of
symbolic dims become the relations that must hold (``t <= 64``), deduplicated and simplified with
sympy: a relation of one symbol is a bound on it (``2*t + 1 > 9`` bounds ``t >= 5``), only the
relation of the tightest lower and upper bound of each symbol is kept (as the program wrote it)
and a lower bound the symbol's own guard implies (``t >= 2``, sizes 0 and 1 being specialized)
is dropped; other relations are kept once each. A call outside the bounds fails one guard,
whose text names the bound.

Example:
    >>> import sympy
    >>> t = sympy.Symbol("s1", integer=True, positive=True)
    >>> at_least_1 = sympy.Ge(t, 1, evaluate=False)
    >>> preds = [(t > 64, False), (at_least_1, True), (2 * t + 1 > 9, True), (t <= 100, True)]
    >>> [(str(r), o) for r, o in simplified(preds, {t})]
    [('s1 <= 64', True), ('2*s1 + 1 > 9', True)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from typing import Any

import sympy

# NOTE: the lower bound every symbol's own guard states (frontend.dynamic_dims: 0 and 1 specialize)
SYMBOL_MIN = 2


def simplified(predicates: Sequence[tuple[Any, bool]], symbols: Set[Any]) -> list[tuple[Any, bool]]:
    """The guards' relations for ``predicates`` (relation, outcome), ``symbols`` being the
    program's symbolic sizes: comparisons of static dims as captured, the others as relations
    that must hold (outcome True), deduplicated, each symbol's bounds reduced to its tightest
    lower and upper one (as the program wrote them), in the order the program made them."""
    kept: list[tuple[Any, bool]] = []
    lower: dict[Any, tuple[int, int]] = {}  # symbol -> (bound, index in kept)
    upper: dict[Any, tuple[int, int]] = {}
    seen: set[str] = set()
    for rel, outcome in predicates:
        if not rel.free_symbols & symbols:
            kept.append((rel, outcome))
            continue
        holds = rel if outcome else rel.negated
        if str(holds) in seen:
            continue
        seen.add(str(holds))
        bound = _bound(holds, symbols)
        if bound is None:
            kept.append((holds, True))
            continue
        sym, lo, hi = bound
        at = len(kept)
        kept.append((holds, True))
        for value, table, tighter in ((lo, lower, max), (hi, upper, min)):
            if value is None:
                continue
            old = table.get(sym)
            if old is None or tighter(old[0], value) != old[0]:
                table[sym] = (value, at)
    chosen = {at for _, at in upper.values()}
    chosen |= {at for value, at in lower.values() if value > SYMBOL_MIN}
    return [
        pred
        for at, pred in enumerate(kept)
        if not pred[0].free_symbols & symbols or _bound(pred[0], symbols) is None or at in chosen
    ]


def _bound(rel: Any, symbols: Set[Any]) -> tuple[Any, int | None, int | None] | None:
    """``rel`` as integer bounds ``(symbol, lo, hi)`` on one symbol, when it is linear in one
    symbolic size with nothing else free; None otherwise."""
    if not isinstance(rel, (sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge, sympy.Eq)):
        return None
    expr = sympy.expand(rel.lhs - rel.rhs)
    free = expr.free_symbols
    if len(free) != 1 or not free <= symbols:
        return None
    (sym,) = free
    if not expr.is_polynomial(sym):
        return None  # NOTE: e.g. floor(s1/2): a compound size, kept as captured
    poly = sympy.Poly(expr, sym)
    if poly.degree() != 1:
        return None
    k, m = poly.all_coeffs()
    if not (k.is_Integer and m.is_Integer) or k == 0:
        return None
    k, m = int(k), int(m)
    # NOTE: k*s + m op 0, for integer s
    if isinstance(rel, sympy.Eq):
        if m % k:
            return None
        return sym, -m // k, -m // k
    strict = isinstance(rel, (sympy.Lt, sympy.Gt))
    greater = isinstance(rel, (sympy.Gt, sympy.Ge)) == (k > 0)
    edge = sympy.Rational(-m, k)
    if greater:  # s > edge (strict) or s >= edge
        lo = math.floor(edge) + 1 if strict else math.ceil(edge)
        return sym, lo, None
    hi = math.ceil(edge) - 1 if strict else math.floor(edge)
    return sym, None, hi

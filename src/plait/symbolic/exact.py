"""Size expressions and relations as Python functions that compute exactly.

A guard on a size comparison (``(n - 10) // 3 == -1``, captured as
``Eq(floor(s1/3 - 10/3), -1)``) is evaluated at every call. ``sympy.lambdify`` prints rational
constants as float divisions (``floor((1/3)*s1 - 10/3)``), whose rounding decides a floor or a
comparison wrongly (``-1.0000000000000004`` at ``s1 = 7``); here integers stay ``int``, rational
constants and divisions are :class:`fractions.Fraction`, and ``floor``, ``ceiling`` and ``Mod``
are exact on both. An expression of any other form is evaluated by sympy's substitution (exact,
slower).

The code is generated from the expression tree only (integers and positional argument names):
nothing of a symbol's name or an artifact's text reaches it.

Example:
    >>> import sympy
    >>> s1 = sympy.Symbol("s1", integer=True, positive=True)
    >>> holds = exact_function(sympy.Eq(sympy.floor((s1 - 10) / 3), -1), [s1])
    >>> [n for n in range(2, 14) if holds(n)]
    [7, 8, 9]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import sympy

_RELATIONS = {
    sympy.Eq: "==",
    sympy.Ne: "!=",
    sympy.Lt: "<",
    sympy.Le: "<=",
    sympy.Gt: ">",
    sympy.Ge: ">=",
}
_NAMESPACE = {"_F": Fraction, "_floor": math.floor, "_ceil": math.ceil, "max": max, "min": min}


class _NotExact(Exception):
    """A node the exact printer has no form for."""


def exact_function(expr: Any, symbols: Sequence[sympy.Symbol]) -> Callable[..., Any]:
    """``expr`` (a size expression or a relation) as a function of ``symbols``' integer values,
    in that order, computed exactly (see the module doc)."""
    names = {s: f"_a{i}" for i, s in enumerate(symbols)}
    try:
        body = _code(expr, names)
    except _NotExact:
        return lambda *values: expr.subs(dict(zip(symbols, values)))
    args = ", ".join(names.values())
    scope: dict[str, Any] = dict(_NAMESPACE)
    exec(f"def _exact({args}):\n    return {body}\n", scope)
    fn: Callable[..., Any] = scope["_exact"]
    return fn


def _code(e: Any, names: dict[sympy.Symbol, str]) -> str:
    if e is sympy.true or e is sympy.false:
        return "True" if e is sympy.true else "False"
    for kind, op in _RELATIONS.items():
        if isinstance(e, kind):
            return f"({_code(e.lhs, names)} {op} {_code(e.rhs, names)})"
    if not isinstance(e, sympy.Expr):
        raise _NotExact(str(e))
    if e.is_Integer:
        return f"({int(e)})"
    if e.is_Rational:
        return f"_F({int(e.p)}, {int(e.q)})"
    if e.is_Symbol:
        if e not in names:
            raise _NotExact(str(e))
        return names[e]
    if e.is_Add:
        return "(" + " + ".join(_code(a, names) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + " * ".join(_code(a, names) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer:
        k = int(e.exp)
        base = _code(e.base, names)
        return f"({base} ** {k})" if k >= 0 else f"(_F(1) / _F({base} ** {-k}))"
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        fn = "_floor" if isinstance(e, sympy.floor) else "_ceil"
        return f"{fn}({_code(e.args[0], names)})"
    if isinstance(e, sympy.Mod):
        return f"({_code(e.args[0], names)} % {_code(e.args[1], names)})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(e, sympy.Max) else "min"
        return f"{fn}({', '.join(_code(a, names) for a in e.args)})"
    if isinstance(e, sympy.Abs):
        return f"abs({_code(e.args[0], names)})"
    raise _NotExact(str(e))

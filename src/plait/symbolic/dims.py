"""Dimensions: ``int`` or sympy integer expressions, with an exact text form.

NOTE: parsing never calls ``eval``/``sympify`` on text: exported artifacts are parsed here, and
loading an artifact must never execute code from it. The grammar is small: integers, symbols,
``+ - * / **``, parentheses and the functions ``floor``, ``ceiling``, ``Mod``, ``Max``, ``Min``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import TypeAlias

import sympy

Dim: TypeAlias = int | sympy.Expr

_SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# NOTE: ``dd0``, ``dd1``, ...: unbacked sizes, the data-dependent dims of a node's result
# (``nonzero``'s row count). Known only when the node has run; never bound by an input, never
# guarded, and possibly 0 or 1 (so nonnegative, not positive).
UNBACKED_RE = re.compile(r"dd\d+\Z")
_FUNCTIONS = {
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
    "Mod": sympy.Mod,
    "Max": sympy.Max,
    "Min": sympy.Min,
}
_TOKEN_RE = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|[-+*/(),]))")


class SymbolicSizeError(TypeError):
    """A symbolic size used where a number is needed (a branch on it, its value before a call
    binds it), or a dimension of a wrong type. Code ``PLAIT-C154`` (``plait.errors.code_of``:
    the symbolic layer imports nothing of plait, so it is classified by name)."""


class SymbolicValueError(ValueError):
    """A dimension or symbol name that is not valid, or one that cannot be evaluated (unbound
    symbols). Code ``PLAIT-C154``, classified by name."""


class DimParseError(ValueError):
    """A dimension expression could not be parsed; ``pos`` is the 0-based offset in the text."""

    def __init__(self, message: str, text: str, pos: int) -> None:
        super().__init__(f"{message} at offset {pos} in {text!r}")
        self.message = message
        self.text = text
        self.pos = pos


def symbol(name: str) -> sympy.Symbol:
    """A positive integer symbol (sizes are never negative; size 0 and 1 are specialized);
    an unbacked name (``dd0``) is a nonnegative one (see :func:`unbacked_symbol`)."""
    if not _SYMBOL_RE.match(name) or name in _FUNCTIONS:
        raise SymbolicValueError(f"invalid symbol name {name!r}: use an identifier such as 's0'")
    if UNBACKED_RE.match(name):
        return sympy.Symbol(name, integer=True, nonnegative=True)
    return sympy.Symbol(name, integer=True, positive=True)


def unbacked_symbol(index: int) -> sympy.Symbol:
    """The ``index``-th unbacked size of a graph: a dim only known once the node that makes it
    has run (``nonzero``'s row count), which may be 0 or 1.

    Example:
        >>> s = unbacked_symbol(0)
        >>> str(s), is_unbacked(s + 1), is_unbacked(symbol("s0"))
        ('dd0', True, False)
    """
    return symbol(f"dd{int(index)}")


def is_unbacked(d: Dim) -> bool:
    """Whether ``d`` depends on an unbacked size."""
    return isinstance(d, sympy.Expr) and any(UNBACKED_RE.match(str(s)) for s in d.free_symbols)


def has_unbacked(dims: Iterable[Dim]) -> bool:
    """Whether any of ``dims`` depends on an unbacked size."""
    return any(is_unbacked(d) for d in dims)


def normalize(d: Dim) -> Dim:
    """Return a plain ``int`` for constant expressions, the expression otherwise."""
    if isinstance(d, bool):
        raise SymbolicSizeError("a dimension cannot be a bool")
    if isinstance(d, int):
        return d
    if isinstance(d, sympy.Expr):
        d = sympy.expand(d) if d.is_Add or d.is_Mul else d
        if d.is_Integer:
            return int(d)
        if d.is_number:
            raise SymbolicValueError(f"dimension {d} is not an integer")
        return d
    raise SymbolicSizeError(
        f"a dimension must be an int or a sympy expression, got {type(d).__name__}"
    )


def is_static(d: Dim) -> bool:
    return isinstance(normalize(d), int)


def dim_to_text(d: Dim) -> str:
    if type(d) is int:
        return str(d)
    return _expr_text(d)


@functools.lru_cache(maxsize=8192)
def _expr_text(d: Dim) -> str:
    """NOTE: memoized: sympy prints an expression in tens of microseconds, and the verifier and
    the IR text print each symbolic type many times (ResNet-18 with symbolic image sizes: 2.7 s
    of a 5 s compile before)."""
    return str(normalize(d))


def free_symbols(dims: Iterable[Dim]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for d in dims:
        if isinstance(d, sympy.Expr):
            out |= d.free_symbols
    return out


def evaluate(d: Dim, bindings: Mapping[str | sympy.Symbol, int]) -> int:
    """Substitute concrete sizes for symbols and return an ``int``."""
    if isinstance(d, int):
        return d
    subs = {(symbol(k) if isinstance(k, str) else k): v for k, v in bindings.items()}
    value = d.subs(subs)
    if not value.is_Integer:
        missing = sorted(str(s) for s in value.free_symbols)
        raise SymbolicValueError(f"cannot evaluate {d}: unbound symbols {missing}")
    return int(value)


@functools.lru_cache(maxsize=4096)
def _difference(a: Dim, b: Dim) -> sympy.Expr:
    """``a - b`` simplified: expanded first (sizes are mostly polynomials in the symbols, which
    expansion decides), ``sympy.simplify`` only where that leaves symbols (floor, Mod...)."""
    diff = sympy.expand(sympy.Integer(0) + a - b)
    return diff if diff.is_number else sympy.simplify(diff)


def known_equal(a: Dim, b: Dim) -> bool:
    """True when ``a == b`` for every value of the symbols."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:  # NOTE: structurally equal (sympy's ==): no algebra (sympy's first is slow)
        return True
    return bool(_difference(a, b) == 0)


def known_not_equal(a: Dim, b: Dim) -> bool:
    """True when ``a != b`` is provable (different constants, or a nonzero constant difference)."""
    if isinstance(a, int) and isinstance(b, int):
        return a != b
    diff = _difference(a, b)
    return bool(diff.is_number and diff != 0)


def dims_equal(a: Dim, b: Dim) -> bool:
    """Structural equality after normalization (what the verifier compares)."""
    na, nb = normalize(a), normalize(b)
    if isinstance(na, int) and isinstance(nb, int):
        return na == nb
    return known_equal(na, nb)


def product(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return normalize(out)


def parse_dim(text: str) -> Dim:
    """Parse the text form of a dimension back into an ``int`` or expression."""
    parser = _Parser(text)
    value = parser.expr()
    if parser.peek() is not None:
        raise DimParseError(f"unexpected {parser.peek()!r}", text, parser.pos)
    return normalize(value)


class _Parser:
    """Recursive descent over
    sum := term (('+'|'-') term)*;  term := unary (('*'|'/') unary)*;
    unary := '-' unary | power;  power := atom ('**' unary)?;
    atom := int | name | call | '(' sum ')'.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN_RE.match(text, pos)
            if not m:
                raise DimParseError("unexpected character", text, pos)
            start = m.start(m.lastindex or 0)
            self.tokens.append((m.group(m.lastindex or 0), start))
            pos = m.end()
        self.index = 0

    @property
    def pos(self) -> int:
        if self.index < len(self.tokens):
            return self.tokens[self.index][1]
        return len(self.text)

    def peek(self) -> str | None:
        return self.tokens[self.index][0] if self.index < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        tok = self.peek()
        if tok is None:
            raise DimParseError(
                f"expected {expected or 'a value'}, found end of text", self.text, self.pos
            )
        if expected is not None and tok != expected:
            raise DimParseError(f"expected {expected!r}, found {tok!r}", self.text, self.pos)
        self.index += 1
        return tok

    def expr(self) -> sympy.Expr:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> sympy.Expr:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.unary()
            value = value * rhs if op == "*" else value / rhs
        return value

    def unary(self) -> sympy.Expr:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return base ** self.unary()
        return base

    def atom(self) -> sympy.Expr:
        pos = self.pos
        tok = self.take()
        if tok.isdigit():
            return sympy.Integer(int(tok))
        if tok == "(":
            value = self.expr()
            self.take(")")
            return value
        if tok in _FUNCTIONS:
            self.take("(")
            args = [self.expr()]
            while self.peek() == ",":
                self.take()
                args.append(self.expr())
            self.take(")")
            return _FUNCTIONS[tok](*args)
        if _SYMBOL_RE.match(tok):
            return symbol(tok)
        raise DimParseError(f"unexpected {tok!r}", self.text, pos)

"""L3 building blocks: symbolic dimensions on sympy.

A dimension is a plain ``int`` or a sympy integer expression over positive integer symbols.

Example:
    >>> from plait.symbolic import symbol, parse_dim, dim_to_text
    >>> s0 = symbol("s0")
    >>> dim_to_text(2 * s0 + 1)
    '2*s0 + 1'
    >>> parse_dim("2*s0 + 1") == 2 * s0 + 1
    True
"""

from plait.symbolic.dims import (
    UNBACKED_RE,
    Dim,
    DimParseError,
    SymbolicSizeError,
    SymbolicValueError,
    dim_to_text,
    dims_equal,
    evaluate,
    free_symbols,
    has_unbacked,
    is_static,
    is_unbacked,
    known_equal,
    known_not_equal,
    normalize,
    parse_dim,
    product,
    symbol,
    unbacked_symbol,
)

__all__ = [
    "UNBACKED_RE",
    "Dim",
    "DimParseError",
    "SymbolicSizeError",
    "SymbolicValueError",
    "dim_to_text",
    "dims_equal",
    "evaluate",
    "free_symbols",
    "has_unbacked",
    "is_static",
    "is_unbacked",
    "known_equal",
    "known_not_equal",
    "normalize",
    "parse_dim",
    "product",
    "symbol",
    "unbacked_symbol",
]

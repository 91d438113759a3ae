"""The text of a literal operand or attribute value, as the IR text writes it.

Example:
    >>> import torch
    >>> format_value((1, 2.5, None, True, torch.float16, "a"))
    '[1, 2.5, none, true, f16, "a"]'
"""

from __future__ import annotations

import json
import math
from typing import Any

import sympy
import torch

from plait.ir.errors import IRTypeError, IRValueError
from plait.ir.types import DTYPES_BY_NAME, SCALAR_KINDS, dtype_name
from plait.symbolic import dim_to_text

# NOTE: words the IR text reads as keywords, dtypes or scalar kinds: never a symbol's name
RESERVED = {"true", "false", "none", "inf", "nan", *DTYPES_BY_NAME, *SCALAR_KINDS}


def format_value(v: Any) -> str:
    """Text of a literal operand or attribute value."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, sympy.Expr):
        names = {str(s) for s in v.free_symbols} & RESERVED
        if names:
            raise IRValueError(f"symbol names {sorted(names)} are reserved words in the IR text")
        return f"({dim_to_text(v)})"
    if isinstance(v, tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    raise IRTypeError(f"cannot print attribute value {v!r} of type {type(v).__name__}")


def same_attr(a: Any, b: Any) -> bool:
    """Whether two attribute values are the same value (same type, same text)."""
    return type(a) is type(b) and format_value(a) == format_value(b)

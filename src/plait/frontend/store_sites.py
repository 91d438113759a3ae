"""The line of the program that made a store capture refuses (a memo written into a value the
program read), for the error that names it.

Capture sees a change of a Python value it read only once the program has run (it compares the
value keys, :mod:`plait.frontend.pyreads`); what changed is known (:meth:`Originals.changes
<plait.frontend.pyrollback.Originals.changes>`: ``self.st.scale`` set, ``self.cache`` given a
key, ``self.hist`` appended to), the line is not. :func:`store_line` finds it in the bytecode of
the program's functions that ran: the instruction that makes such a store (``STORE_ATTR scale``;
``STORE_SUBSCR``, ``append`` ...) on a line that also loads a name the value was reached by
(``cache`` in ``self.cache[k] = t``). None when no instruction matches: the message then names
the value alone.

Example:
    >>> def f(self, t):
    ...     self.cache["k"] = t
    >>> line = store_line([f.__code__], [("item", "k", ("cache",))])
    >>> line[1] == f.__code__.co_firstlineno + 1
    True
"""

from __future__ import annotations

import dis
import linecache
import types
from collections.abc import Iterable, Sequence
from typing import Any

_BIND = frozenset({"STORE_ATTR", "STORE_GLOBAL", "STORE_NAME", "DELETE_ATTR", "DELETE_GLOBAL"})
_ITEM = frozenset({"STORE_SUBSCR", "DELETE_SUBSCR"})
_METHODS = {  # NOTE: the methods that store into a list or a dict
    "list": frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort"}),
    "item": frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__"}),
}


def store_line(
    codes: Iterable[types.CodeType], stores: Sequence[tuple[str, Any, tuple[str, ...]]]
) -> tuple[str, int, str] | None:
    """(file, line, source) of the first instruction in ``codes`` (their nested code
    included) that makes one of ``stores`` (in order), or None."""
    flat = [c for code in codes for c in _nested(code)]
    for how, name, names in stores:
        for code in flat:
            line = _find(code, how, name, set(names))
            if line is not None:
                source = linecache.getline(code.co_filename, line).strip()
                return code.co_filename, line, source
    return None


def _nested(code: types.CodeType) -> list[types.CodeType]:
    out = [code]
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.extend(_nested(c))
    return out


def _find(code: types.CodeType, how: str, name: Any, names: set[str]) -> int | None:
    """The line of ``code`` that makes the store, where one does."""
    lines: dict[int, set[str]] = {}  # NOTE: the names each line loads
    found: list[tuple[int, bool]] = []  # NOTE: (line, whether it must load one of names)
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        if ins.positions is not None and ins.positions.lineno is not None:
            line = ins.positions.lineno
        elif ins.starts_line is not None:
            line = ins.starts_line
        op, arg = ins.opname, ins.argval
        if isinstance(arg, str):
            lines.setdefault(line, set()).add(arg)
        if how in ("bind", "attr") and op in _BIND and arg == name:
            found.append((line, how == "attr"))
        elif how in ("item", "list") and (
            op in _ITEM
            or (op in ("LOAD_METHOD", "LOAD_ATTR") and arg in _METHODS[how])
            or (how == "list" and op == "BINARY_OP" and ins.argrepr == "+=")
        ):
            found.append((line, True))
    for at, needs in found:
        if not needs or lines.get(at, set()) & names:
            return at
    return None

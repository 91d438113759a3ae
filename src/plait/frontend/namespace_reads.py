"""The roots of a module namespace a program reads: by name (a global, a module's attribute) or
whole (code that calls ``globals()``, ``eval``, ``exec``, ``vars``, ``locals`` or
``__import__`` may read any of its names, the names it lacks too).

A namespace holds the program's values and the import system's: ``__loader__`` and ``__spec__``
(pytest's assertion-rewriting hook, whose objects reach the test session; an editable install's
finder; any custom loader) are guarded by identity, never walked by content (see
:func:`plait.frontend.pyvalues.namespace_root`). ``__builtins__`` is guarded by identity too,
and, since ``eval``'d code and ``globals()["__builtins__"]`` read builtins through it, so is
each entry of its table as a builtin the program names is, and the names the table holds. A
namespace read whole has the names it holds guarded as well (``globals().get("LATE")``).

Example:
    >>> import builtins
    >>> roots = name_roots({"__builtins__": builtins}, "__builtins__", "m.__builtins__", None)
    >>> roots[0][1].identity, roots[1][1].show, len(roots) > 100
    (True, 'the names of builtins', True)
"""

from __future__ import annotations

import builtins
import dis
import functools
import types
from typing import Any

from plait.frontend.pyvalues import ABSENT, Root, names_root, namespace_root

WHOLE_NAMESPACE = frozenset({"globals", "eval", "exec", "vars", "locals", "__import__"})


@functools.lru_cache(maxsize=4096)
def global_loads(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` loads as globals (nested comprehensions included)."""
    out: list[str] = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
            out.append(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType) and c.co_name.startswith("<") and c.co_name != "<lambda>":
            out.extend(global_loads(c))
    return tuple(dict.fromkeys(out))


@functools.lru_cache(maxsize=4096)
def imported_names(code: types.CodeType) -> tuple[tuple[str, int], ...]:
    r"""The modules ``code`` imports as it runs (``import m``, ``from m import x`` inside a
    function), each as (name, level): ``level`` > 0 for a relative import.

    >>> imported_names(compile("from os import sep\nimport json.decoder", "f", "exec"))
    (('os', 0), ('json.decoder', 0))
    """
    out: list[tuple[str, int]] = []
    consts: list[Any] = []
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_CONST":
            consts.append(ins.argval)
        elif ins.opname == "IMPORT_NAME" and isinstance(ins.argval, str):
            level = consts[-2] if len(consts) >= 2 and isinstance(consts[-2], int) else 0
            out.append((ins.argval, level))
    for c in code.co_consts:
        if isinstance(c, types.CodeType) and c.co_name.startswith("<") and c.co_name != "<lambda>":
            out.extend(imported_names(c))
    return tuple(dict.fromkeys(out))


@functools.lru_cache(maxsize=4096)
def attr_names(code: types.CodeType) -> frozenset[str]:
    """The attribute names ``code`` uses and its identifier-like string constants."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= attr_names(c)
        elif isinstance(c, str) and c.isidentifier():
            out.add(c)
    return frozenset(out)


def name_roots(
    namespace: dict, name: str, show: str, desc: list[Any] | None, shallow: bool = False
) -> list[tuple[tuple[Any, ...], Root]]:
    """``(key, root)`` for ``name`` of a module namespace (``show`` names it for a user,
    ``desc`` finds it again in another process), with the roots ``__builtins__`` needs."""
    out: list[tuple[tuple[Any, ...], Root]] = [
        (("item", id(namespace), name), namespace_root(namespace, name, show, desc, shallow))
    ]
    if name != "__builtins__":
        return out
    found = namespace.get(name, ABSENT)
    table = vars(found) if isinstance(found, types.ModuleType) else found
    if type(table) is not dict:
        # NOTE: no table eval can use: by contents, as any value (and not saved: a warm start
        # would resolve it by identity)
        out[0][1].identity, out[0][1].desc = False, None
        return out
    standard = table is vars(builtins)
    names = names_root(table, "the names of builtins", ["names", None] if standard else None)
    out.append((("names", id(table)), names))
    for entry in table:
        entry_desc = ["builtin", entry] if standard else None
        out.append(
            (
                ("item", id(table), entry),
                namespace_root(table, entry, f"builtin {entry}", entry_desc),
            )
        )
    return out


def whole_names_root(namespace: dict, module: str, resolvable: bool) -> tuple[Any, Root]:
    """``(key, root)`` of the names a namespace read whole holds."""
    desc = ["names", module] if resolvable else None
    return ("names", id(namespace)), names_root(namespace, f"the names of {module}", desc)

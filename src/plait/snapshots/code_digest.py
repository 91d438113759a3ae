"""The meaning of a code object, as another process can compare it: its bytecode, names and
constants (nested code recursively), never its file name or line numbers (:func:`code_digest`);
the names it can read a value by (:func:`names_of`), and of those, the ones it does more with than
test membership in (:func:`read_names`).

Example:
    >>> def f(cfg):
    ...     return getattr(cfg, "SCALE") * 2
    >>> sorted(names_of(f.__code__))
    ['SCALE', 'getattr']
    >>> code_digest(f.__code__) == code_digest(f.__code__)
    True
    >>> def g(self, x):
    ...     return [k for k in self.ORDER] if x in self.NAMES else None
    >>> sorted(read_names(g.__code__))
    ['ORDER']
"""

from __future__ import annotations

import dis
import functools
import hashlib
import types
from collections.abc import Callable, Iterator
from typing import Any

# NOTE: by identity: code objects that differ only in a constant set's order compare equal
_CODE_DIGESTS: dict[int, tuple[types.CodeType, bytes]] = {}


def code_digest(code: types.CodeType) -> bytes:
    hit = _CODE_DIGESTS.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    h = hashlib.sha256()
    for part in _code_parts(code):
        h.update(repr(part).encode() if not isinstance(part, bytes) else part)
    if len(_CODE_DIGESTS) > 4096:
        _CODE_DIGESTS.clear()
    _CODE_DIGESTS[id(code)] = (code, h.digest())
    return h.digest()


def _code_parts(code: types.CodeType) -> Iterator[Any]:
    """The meaning of ``code``: bytecode, names, constants (nested code recursively); never its
    file name or line numbers."""
    yield code.co_code
    yield (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    yield (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
    tested = _membership_only(code)
    for i, c in enumerate(code.co_consts):
        if isinstance(c, types.CodeType):
            yield ("code", c.co_qualname)
            yield from _code_parts(c)
        elif i in tested:
            # NOTE: `act in {"relu", "gelu"}` only asks membership: the set's iteration order,
            # which string hashing makes differ between processes, is not part of its meaning
            yield ("frozenset", sorted(repr(v) for v in c))
        else:
            yield (type(c).__name__, repr(c))


def _membership_only(code: types.CodeType) -> set[int]:
    """The frozenset constants of ``code`` that are only ever the right side of ``in``."""
    sets = {i for i, c in enumerate(code.co_consts) if isinstance(c, frozenset)}
    if not sets:
        return sets
    out = set(sets)
    instructions = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    for ins, nxt in zip(instructions, [*instructions[1:], None]):
        membership = nxt is not None and nxt.opname == "CONTAINS_OP"
        if ins.opname == "LOAD_CONST" and ins.arg in out and not membership:
            out.discard(ins.arg)
    return out


@functools.lru_cache(maxsize=4096)
def names_of(code: types.CodeType) -> frozenset[str]:
    """The names ``code`` (and its nested code) loads, and its identifier-like string constants
    (``getattr(cfg, "SCALE")``, ``globals()["SHIFT"]``)."""
    return _with_constants(set(code.co_names), code, names_of)


def _with_constants(
    out: set[str], code: types.CodeType, nested: Callable[[types.CodeType], frozenset[str]]
) -> frozenset[str]:
    """``out`` with ``nested`` of each code constant of ``code`` and its identifier-like string
    constants (alone or in a tuple or frozenset)."""
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= nested(c)
        elif isinstance(c, str) and c.isidentifier():
            out.add(c)
        elif isinstance(c, (tuple, frozenset)):
            out |= {s for s in c if isinstance(s, str) and s.isidentifier()}
    return frozenset(out)


# NOTE: instructions that load a value by a name of co_names
_NAME_LOADS = frozenset({"LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_METHOD"})


@functools.lru_cache(maxsize=4096)
def read_names(code: types.CodeType) -> frozenset[str]:
    """:func:`names_of` less the names ``code`` (and its nested code) only ever loads to test
    membership in (``x in self.NAMES``): a value read only so is never iterated there."""
    member: set[str] = set()
    other: set[str] = set()
    instructions = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
    for ins, nxt in zip(instructions, [*instructions[1:], None]):
        if ins.opcode not in dis.hasname or not isinstance(ins.argval, str):
            continue
        membership = nxt is not None and nxt.opname == "CONTAINS_OP"
        (member if ins.opname in _NAME_LOADS and membership else other).add(ins.argval)
    only_member = member - other
    return _with_constants({n for n in code.co_names if n not in only_member}, code, read_names)

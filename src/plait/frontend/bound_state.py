"""What a compiled callable holds besides its code: the object a method is bound to, the
arguments a ``functools.partial`` fixes, the callable object itself.

``plait.compile(obj.step)``, ``plait.compile(functools.partial(f, cfg))`` and
``plait.compile(obj)`` (an object with ``__call__``) run code that reads that state through a
local name (``self.scale``, ``cfg.flag``), where no global, closure cell or module attribute
read sees it. Each such object is a root of the Python values guard (by its contents, as any
other user object: :mod:`plait.frontend.pyvalues`), read when capture starts, so that a change
after a compile recompiles and a change while the program runs is refused. An ``nn.Module``
(its attribute reads are recorded where they happen), a function, a library object and
immutable values (numbers, strings, tensors by identity) need none: those roots are left out,
and with them nothing is lost of a warm start (a root here has no saved form: the program
itself is not found again by name).

Example:
    >>> import functools
    >>> import torch
    >>> scales = [2.0]
    >>> program = functools.partial(lambda ks, x: x * ks[0], scales)
    >>> [r.show for _, r in bound_roots(program)]
    ['the arguments the compiled functools.partial fixes']
    >>> bound_roots(torch.nn.Linear(2, 2).forward), bound_roots(lambda x: x)
    ([], [])
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from plait.frontend.pyvalues import TYPE, Root, _Walk


def _held(program: Any, depth: int = 0) -> list[tuple[str, Callable[[], Any]]]:
    """(what it is, a reader of it now) for each object ``program`` holds besides its code."""
    if depth > 8 or isinstance(program, (types.FunctionType, nn.Module)):
        return []
    if isinstance(program, types.MethodType):
        name = getattr(program.__func__, "__name__", "?")
        held = [(f"the object the compiled method {name} is bound to", lambda: program.__self__)]
        return held + _held(program.__func__, depth + 1)
    if isinstance(program, functools.partial):
        held = [("the arguments the compiled functools.partial fixes", lambda: program.args)]
        return held + _held(program.func, depth + 1)
    if callable(program) and not isinstance(program, (type, types.BuiltinFunctionType)):
        return [(f"the compiled {type(program).__qualname__} object", lambda: program)]
    return []


def _bare_tensors(v: Any) -> bool:
    """Tensors without Python attributes (a tuple of them): nothing in them changes unseen (a
    tensor's value key checks its instance dict, empty here: an attribute set later on a
    tensor a partial fixes is not guarded, as before)."""
    if type(v) is tuple:
        return bool(v) and all(_bare_tensors(x) for x in v)
    return isinstance(v, torch.Tensor) and not getattr(v, "__dict__", None)


def bound_roots(program: Any) -> list[tuple[tuple[Any, ...], Root]]:
    """The roots (with their keys in a :class:`~plait.frontend.pyreads.PyReads`) of what
    ``program`` holds that can change: those whose value key has a check or names a host."""
    out = []
    for k, (show, read) in enumerate(_held(program)):
        walk = _Walk()
        walk.key(read())
        if (not walk.checks and not walk.hosts) or _bare_tensors(read()):
            continue  # NOTE: nothing in it can change (a module, numbers, a tensor)
        root = Root(show, read, None, lambda v: (TYPE, v, type(v)))
        out.append((("bound", id(program), k), root))
    return out


__all__ = ["bound_roots"]

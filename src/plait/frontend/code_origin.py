"""Where code comes from, for capture and for warm starts: whether a module's code is pinned by
the toolchain versions (PyTorch's, plait's, NumPy's, SymPy's and the standard library's own),
the function a module names under a qualified name in this process (no import), the class a
generated namedtuple or dataclass method belongs to, and what belongs to the import system (a
module's import metadata, loaders and finders).

Example:
    >>> is_pinned("torch.nn.functional"), is_pinned("my_project.model")
    (True, False)
    >>> find_function("plait.frontend.code_origin", "is_pinned") is is_pinned
    True
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
import types
from typing import Any

# NOTE: code of these top-level packages is pinned by the toolchain versions in every key
# (functorch and torchgen ship inside the PyTorch wheel).
_PINNED_TOP = frozenset(
    {"torch", "functorch", "torchgen", "plait", "sympy", "mpmath", "typing_extensions", "numpy"}
)
# NOTE: a standard library module's name is pinned only when the module loaded under it is the
# standard library's: a user's own `test/` package or `trace.py` is user code.
_STDLIB_NAMES = frozenset(sys.stdlib_module_names)
_STDLIB_DIRS = tuple(
    {os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")}
)
_STDLIB_SEEN: dict[str, tuple[types.ModuleType, bool]] = {}


def is_pinned(module: str) -> bool:
    top = module.split(".", 1)[0]
    if top in _PINNED_TOP:
        return True
    return top in _STDLIB_NAMES and _is_stdlib(top)


def _is_stdlib(top: str) -> bool:
    mod = sys.modules.get(top)
    if mod is None:
        return True  # NOTE: nothing is loaded under that name: no user code of it can run
    seen = _STDLIB_SEEN.get(top)
    if seen is not None and seen[0] is mod:
        return seen[1]
    file = getattr(mod, "__file__", None)
    paths = [file] if isinstance(file, str) else list(getattr(mod, "__path__", None) or [])
    real = [os.path.realpath(p) for p in paths]
    verdict = all(
        r.startswith(_STDLIB_DIRS) and "site-packages" not in r and "dist-packages" not in r
        for r in real
    )
    _STDLIB_SEEN[top] = (mod, verdict)
    return verdict


def lookup(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names in this process (no import), or None."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", None)
        if isinstance(namespace, (dict, types.MappingProxyType)) and part in namespace:
            obj = namespace[part]
        else:
            try:
                obj = getattr(obj, part, None)
            except Exception:  # NOTE: a property or __getattr__ of user code
                return None
        if obj is None:
            return None
    return obj


def find_function(module: str, qualname: str) -> types.FunctionType | None:
    """The function ``module.qualname`` in this process (no import: its module must be loaded
    already, as it is when its code can run), or None."""
    obj = lookup(module, qualname)
    return None if obj is None else unwrap(obj, qualname)


def unwrap(obj: Any, qualname: str) -> types.FunctionType | None:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if isinstance(f, types.FunctionType) and f.__code__.co_qualname == qualname:
                return f
        return None
    if isinstance(obj, functools.cached_property):
        obj = obj.func
    seen = 0
    while not isinstance(obj, types.FunctionType) or obj.__code__.co_qualname != qualname:
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
        if obj is None or seen > 8:
            return None
    return obj


def generated_for(frame: types.FrameType, module: str, qualname: str) -> type | None:
    """The class a namedtuple ``__new__`` or a dataclass method was generated for, else None."""
    code = frame.f_code
    if code.co_filename != "<string>" or not code.co_argcount:
        return None
    if module.startswith("namedtuple_") and qualname == "<lambda>":
        cls = frame.f_locals.get("_cls")
        return cls if isinstance(cls, type) and hasattr(cls, "_fields") else None
    if qualname.startswith("__create_fn__.<locals>."):
        first = frame.f_locals.get(code.co_varnames[0])
        cls = first if isinstance(first, type) else type(first)
        return cls if dataclasses.is_dataclass(cls) else None
    return None


# NOTE: the modules whose frames run an import (a finder, a module body), not the program
IMPORT_SYSTEM = frozenset(
    {
        "_frozen_importlib",
        "_frozen_importlib_external",
        "importlib._bootstrap",
        "importlib._bootstrap_external",
    }
)


def under_import(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs for the import system (a finder), not for the program."""
    caller = frame.f_back
    while caller is not None:
        if caller.f_globals.get("__name__") in IMPORT_SYSTEM:
            return True
        caller = caller.f_back
    return False


# NOTE: a module's import metadata that holds objects of the import system (its loader, its
# spec), not values of the program: guarded by identity wherever a module namespace is read
IMPORT_METADATA = frozenset({"__loader__", "__spec__"})
_IMPORT_MACHINERY = (
    importlib.abc.Loader,
    importlib.abc.MetaPathFinder,
    importlib.abc.PathEntryFinder,
    importlib.machinery.ModuleSpec,
)


def is_import_machinery(v: Any) -> bool:
    """Whether ``v`` is an object of the import system: a loader, a finder or a module spec
    (pytest's assertion-rewriting hook, an editable install's finder), whatever its package."""
    return isinstance(v, _IMPORT_MACHINERY)

"""What a capture depended on beyond its inputs: the Python code it ran and the values that code
and the module could read, written so that another process can check them without capturing.

:class:`CodeRecorder` records every Python function that runs during a capture (a profile hook,
installed only for the capture). :func:`code_deps` turns the record into :class:`CodeDep` items:
each function found again by its module and qualified name, with a digest of its bytecode
(constants and nested code included; file names and line numbers excluded) and of its defaults,
and the module-level values its code can read by name. PyTorch's, plait's and the standard
library's own code is left out: the toolchain versions in every cache key cover it.
:func:`module_fingerprint` is the same for an ``nn.Module`` tree: classes, and every plain
attribute of every submodule and of their classes.

Anything these cannot pin down (a nested function or a lambda, whose closure cannot be read back
by name; a global that is an arbitrary object; a forward hook) raises :class:`Unpinnable`, with
the reason: such a program is captured on every warm start, never assumed unchanged.

Example:
    >>> import torch
    >>> fp = module_fingerprint(torch.nn.Linear(2, 3))
    >>> fp[0]["class"], fp[0]["attrs"]["in_features"]
    ('torch.nn.modules.linear.Linear', ['int', '2'])
"""

from __future__ import annotations

import enum
import hashlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# NOTE: code of these top-level packages is pinned by the toolchain versions in every key.
_PINNED_TOP = frozenset({"torch", "plait", "sympy", "typing_extensions", "numpy"}) | frozenset(
    sys.stdlib_module_names
)
# NOTE: nested code of these kinds is part of its enclosing function's digest, which also ran.
_INLINE = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


class Unpinnable(Exception):
    """A dependency another process cannot check without capturing (the message says which)."""


@dataclass(frozen=True)
class CodeDep:
    """A function the capture ran: ``module`` and ``qualname`` find it again; ``digest`` covers
    its code, defaults and the module-level values its code names."""

    module: str
    qualname: str
    digest: str


# --- recording ------------------------------------------------------------------------------
class CodeRecorder:
    """Records the code objects that run while active (``with CodeRecorder() as rec:``).

    NOTE: a profile hook is per thread; one already installed (a profiler) is left alone and
    nothing is recorded (``refusal`` says so)."""

    def __init__(self) -> None:
        self.codes: dict[int, tuple[types.CodeType, dict[str, Any]]] = {}
        self.refusal: str | None = None
        self._installed = False

    def _hook(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if id(code) not in self.codes:
                self.codes[id(code)] = (code, frame.f_globals)

    def __enter__(self) -> CodeRecorder:
        if sys.getprofile() is not None:
            self.refusal = "a profiler was active during capture"
        else:
            sys.setprofile(self._hook)
            self._installed = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._installed:
            sys.setprofile(None)
            self._installed = False

    def deps(self) -> list[CodeDep]:
        """The recorded code as :class:`CodeDep` items; raises :class:`Unpinnable`."""
        if self.refusal is not None:
            raise Unpinnable(self.refusal)
        return code_deps(self.codes.values())


def _pinned(module: str) -> bool:
    return module.split(".", 1)[0] in _PINNED_TOP


def code_deps(codes: Any) -> list[CodeDep]:
    out: dict[tuple[str, str], CodeDep] = {}
    for code, globals_ in codes:
        module = str(globals_.get("__name__", ""))
        if _pinned(module):
            continue
        qualname = code.co_qualname
        if qualname.rsplit(".", 1)[-1] in _INLINE:
            continue
        if "<" in qualname:
            raise Unpinnable(
                f"the program runs {module}.{qualname}: a nested function or lambda, whose "
                "closure cannot be checked without capturing"
            )
        fn = find_function(module, qualname)
        if fn is None or fn.__code__ is not code:
            raise Unpinnable(f"{module}.{qualname} ran but cannot be found again by its name")
        out[(module, qualname)] = CodeDep(module, qualname, function_digest(fn))
    return sorted(out.values(), key=lambda d: (d.module, d.qualname))


# --- finding and digesting ------------------------------------------------------------------
def find_function(module: str, qualname: str) -> types.FunctionType | None:
    """The function ``module.qualname`` in this process (no import: its module must be loaded
    already, as it is when its code can run), or None."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in qualname.split("."):
        namespace = getattr(obj, "__dict__", {})
        obj = namespace[part] if part in namespace else getattr(obj, part, None)
        if obj is None:
            return None
    return _unwrap(obj, qualname)


def _unwrap(obj: Any, qualname: str) -> types.FunctionType | None:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for f in (obj.fget, obj.fset, obj.fdel):
            if isinstance(f, types.FunctionType) and f.__code__.co_qualname == qualname:
                return f
        return None
    seen = 0
    while not isinstance(obj, types.FunctionType) or obj.__code__.co_qualname != qualname:
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
        if obj is None or seen > 8:
            return None
    return obj


def _code_parts(code: types.CodeType) -> Iterator[Any]:
    """The meaning of ``code``: bytecode, names, constants (nested code recursively); never its
    file name or line numbers."""
    yield code.co_code
    yield (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    yield (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield ("code", c.co_qualname)
            yield from _code_parts(c)
        else:
            yield (type(c).__name__, repr(c))


def _names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def function_digest(fn: types.FunctionType) -> str:
    """SHA-256 over the function's code, defaults, and the module-level values its code names
    (raises :class:`Unpinnable` for a value that has no fingerprint)."""
    h = hashlib.sha256()
    for part in _code_parts(fn.__code__):
        h.update(repr(part).encode() if not isinstance(part, bytes) else part)
    h.update(repr(fingerprint(fn.__defaults__, f"{fn.__qualname__} defaults")).encode())
    h.update(repr(fingerprint(fn.__kwdefaults__, f"{fn.__qualname__} defaults")).encode())
    globals_ = fn.__globals__
    for name in sorted(_names(fn.__code__)):
        if name in globals_:
            what = f"global {globals_.get('__name__')}.{name}"
            h.update(repr((name, fingerprint(globals_[name], what))).encode())
    return h.hexdigest()


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def fingerprint(value: Any, what: str) -> Any:
    """A process-independent, comparable description of ``value``; raises :class:`Unpinnable`
    for an object whose state cannot be described (``what`` names it in the message)."""
    if isinstance(value, _PLAIN):
        return [type(value).__name__, repr(value)]
    if isinstance(value, (torch.dtype, torch.device, torch.Size, torch.layout)):
        return [type(value).__name__, str(value)]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [fingerprint(v, what) for v in value]]
    if isinstance(value, (set, frozenset)):
        return [type(value).__name__, sorted(repr(fingerprint(v, what)) for v in value)]
    if isinstance(value, dict):
        items = [[fingerprint(k, what), fingerprint(v, what)] for k, v in value.items()]
        return [type(value).__name__, items]
    if isinstance(value, enum.Enum):
        return ["enum", _qualified(type(value)), value.name]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if isinstance(value, type):
        return ["class", _qualified(value)]
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        if "<" in value.__qualname__:
            raise Unpinnable(f"{what} is a nested function or lambda ({value.__qualname__})")
        return ["function", f"{value.__module__}.{value.__qualname__}"]
    if _pinned(type(value).__module__ or "") and callable(value):
        # NOTE: torch's and the standard library's callables (torch.ops, ufuncs) by name
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        if name is not None:
            return ["callable", _qualified(type(value)), str(name)]
    raise Unpinnable(f"{what} is a {_qualified(type(value))}, whose state plait cannot check")


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --- modules --------------------------------------------------------------------------------
_TABLES = ("_parameters", "_buffers", "_modules", "training", "_non_persistent_buffers_set")
_CLASS_SKIP = frozenset(
    {
        "__module__",
        "__doc__",
        "__dict__",
        "__weakref__",
        "__qualname__",
        "__annotations__",
        "__orig_bases__",
        "__parameters__",
        "__dataclass_fields__",
        "__dataclass_params__",
        "_abc_impl",
    }
)


def _hooks(name: str, value: Any, what: str) -> None:
    """Forward and backward hooks run inside the program: a module that has any is captured."""
    if "state_dict" in name or not value:
        return
    raise Unpinnable(f"{what} has hooks ({name}): they run inside the program")


def module_fingerprint(module: nn.Module) -> list[dict[str, Any]]:
    """Every submodule's path, class and plain attributes, and its classes' plain attributes;
    raises :class:`Unpinnable` (hooks, tensor attributes, objects without a fingerprint)."""
    for name in dir(nn.modules.module):
        if name.startswith("_global_") and "hook" in name:
            _hooks(name, getattr(nn.modules.module, name), "torch.nn (global)")
    out = []
    classes: dict[type, Any] = {}
    for path, m in module.named_modules():
        where = f"self.{path}" if path else "self"
        attrs: dict[str, Any] = {}
        for key, value in vars(m).items():
            if key in _TABLES:
                continue
            if "hook" in key:
                _hooks(key, value, where)
                continue
            if isinstance(value, torch.Tensor):
                raise Unpinnable(f"{where}.{key} is a tensor that is neither parameter nor buffer")
            attrs[key] = fingerprint(value, f"{where}.{key}")
        cls = type(m)
        if cls not in classes:
            classes[cls] = _class_attrs(cls)
        out.append(
            {
                "path": path,
                "class": _qualified(cls),
                "attrs": dict(sorted(attrs.items())),
                "class_attrs": classes[cls],
            }
        )
    return out


def _class_attrs(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if _pinned(base.__module__) or base is object:
            continue
        for key, value in vars(base).items():
            if key in _CLASS_SKIP or isinstance(
                value, (types.FunctionType, staticmethod, classmethod, property)
            ):
                continue
            out[f"{base.__qualname__}.{key}"] = fingerprint(value, f"{_qualified(base)}.{key}")
    return dict(sorted(out.items()))


@contextmanager
def recording(enabled: bool) -> Iterator[CodeRecorder | None]:
    """``with recording(on) as rec``: a :class:`CodeRecorder` when ``enabled``, else None."""
    if not enabled:
        yield None
        return
    with CodeRecorder() as rec:
        yield rec

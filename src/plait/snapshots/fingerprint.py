"""Descriptions of code and values that another process can compare without capturing: the
digest of a function (its bytecode, constants and nested code, never file names or line numbers;
its defaults; the module-level values its code can read by name, a name it loads or a string
constant such as ``getattr(cfg, "SCALE")`` uses; the attributes it names of the modules and
functions those values are; the classes that own it), and the fingerprint of a value or of an
``nn.Module`` tree (:func:`plait.snapshots.modules.module_fingerprint`: classes, their bases,
attributes and methods by name, and every attribute of every submodule).

A value is described by :func:`fingerprint`: plain values by value; containers item by item (a
set in sorted order, its iteration order kept aside: :mod:`plait.snapshots.set_order`); enums by
name and value; user classes by their contents; dataclass configs by class and fields; functions
and classes by module and qualified name, which must find the very object again (a class
redefined since its instances were made is not the class its module names). PyTorch's, plait's,
NumPy's, SymPy's and the standard library's own code is pinned by the toolchain versions in
every key (a PyTorch module attribute that code names is checked for what it holds: ``F.gelu =
my_gelu`` and ``F.silu = torch.tanh`` change a digest, as does a ``torch.Tensor`` or
``nn.Module`` method the code names, replaced: ``torch.Tensor.tanh = torch.Tensor.sigmoid``).
Anything these cannot pin down (an arbitrary object; a method bound to one; a user module held
by an attribute; a forward hook; code that names the environment or the command line) raises
:class:`Unpinnable`, with the reason.

Example:
    >>> fingerprint({"b", "a"}, "NAMES")
    ['set', [['str', "'a'"], ['str', "'b'"]]]
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
import sys
import types
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from plait.frontend.code_origin import is_pinned, lookup, unwrap
from plait.snapshots import set_order
from plait.snapshots.code_digest import code_digest, names_of
from plait.snapshots.set_order import SetOrder, collecting, gate

# NOTE: names through which code reads state that differs from one process to the next.
_PROCESS_STATE = frozenset({"environ", "environb", "getenv", "getenvb", "argv", "orig_argv"})
_MAX_DEPTH = 32


class Unpinnable(Exception):
    """A dependency another process cannot check without capturing (the message says which)."""


def dep_digest(module: str, qualname: str) -> tuple[str, list[SetOrder]]:
    """The digest the dependency ``module.qualname`` has in this process (compare with a
    :class:`CodeDep`'s) and the orders of the sets it describes; raises :class:`Unpinnable`
    when it is not found."""
    obj = lookup(module, qualname)
    if isinstance(obj, type):
        return class_orders(obj)
    fn = unwrap(obj, qualname) if obj is not None else None
    if fn is None:
        raise Unpinnable(f"{module}.{qualname} is not loaded in this process")
    return function_orders(fn)


# --- finding and digesting ------------------------------------------------------------------
def _reachable(found: Any, value: Any) -> bool:
    """Whether ``value`` is ``found`` or what it wraps (a staticmethod, property, decorator)."""
    for _ in range(8):
        if found is value:
            return True
        if isinstance(found, (staticmethod, classmethod)):
            found = found.__func__
        elif isinstance(found, property):
            return value in (found.fget, found.fset, found.fdel)
        elif isinstance(found, functools.cached_property):
            found = found.func
        else:
            found = getattr(found, "__wrapped__", None)
            if found is None:
                return False
    return False


def _a_copy_of(found: Any, value: Any) -> bool:
    """Whether ``value`` is a copy of the function ``found`` (its code, globals, defaults and
    closure, as ``types.FunctionType(f.__code__, ...)`` makes: transformers' ``copy_func`` sets
    ``PreTrainedConfig.push_to_hub`` so, to give it its own docstring): what another process
    would find, as it runs the same code on the same values."""
    if not isinstance(value, types.FunctionType) or not isinstance(found, types.FunctionType):
        return False
    v, f = value, found
    return (
        getattr(v, "__wrapped__", None) is f
        and v.__code__ is f.__code__
        and v.__globals__ is f.__globals__
        and v.__defaults__ is f.__defaults__
        and v.__kwdefaults__ == f.__kwdefaults__
        and v.__closure__ is f.__closure__
    )


def function_digest(fn: types.FunctionType) -> str:
    """SHA-256 over the function's code, defaults, the classes that own it, the module-level
    values its code names and their attributes it names (raises :class:`Unpinnable` for a
    value that has no fingerprint, or for code that reads the environment or command line).
    Sets count by their contents: :func:`function_orders` gives their orders too."""
    return function_orders(fn)[0]


def function_orders(fn: types.FunctionType) -> tuple[str, list[SetOrder]]:
    """:func:`function_digest`, and the iteration orders of the sets it describes."""
    with collecting() as orders:
        return _function_digest(fn), orders


def _function_digest(fn: types.FunctionType) -> str:
    memo: dict[int, Any] = {}  # NOTE: fresh: a digest must not depend on what came before
    where = f"{fn.__module__}.{fn.__qualname__}"
    names = names_of(fn.__code__)
    process = sorted(names & _PROCESS_STATE)
    if process:
        raise Unpinnable(
            f"{where} reads {', '.join(process)}: state of the process (the environment, the "
            "command line) that another process does not share"
        )
    h = hashlib.sha256(code_digest(fn.__code__))
    h.update(repr(_fp(fn.__defaults__, f"{where} defaults", memo, 0)).encode())
    h.update(repr(_fp(fn.__kwdefaults__, f"{where} defaults", memo, 0)).encode())
    # NOTE: the classes the function is defined in (`cls.K`, `self.K` of a helper class)
    module = sys.modules.get(str(fn.__globals__.get("__name__", "")))
    owner: Any = module
    for part in fn.__qualname__.split(".")[:-1]:
        owner = getattr(owner, "__dict__", {}).get(part)
        if isinstance(owner, type):
            h.update(repr(("owner", _fp(owner, f"{where}'s class", memo, 0))).encode())
    globals_ = fn.__globals__
    seen: set[int] = set()
    for name in sorted(names):
        if name not in globals_:
            continue
        value = globals_[name]
        what = f"global {globals_.get('__name__')}.{name}"
        with gate(name, reset=True):
            h.update(repr((name, _value_fp(value, what, memo))).encode())
            _named_attrs(value, names, h, memo, seen, what)
    # NOTE: a method the code may call on a tensor or a module (`y.tanh()`), as the class holds
    # it now: `torch.Tensor.tanh = torch.Tensor.sigmoid` changes what the same bytecode runs
    for name in sorted(names):
        for cls in _LIBRARY_CLASSES:
            found = _class_attr(cls, name)
            if found is not _MISSING:
                h.update(repr(("method", cls.__name__, name, _library_identity(found))).encode())
    return h.hexdigest()


# NOTE: library classes whose methods user code calls by name on values it does not name
_LIBRARY_CLASSES = (torch.Tensor, nn.Module)
_MISSING = object()


def _class_attr(cls: type, name: str) -> Any:
    """``name`` as ``cls`` finds it through its bases' dicts (no descriptor runs)."""
    for klass in cls.__mro__:
        found = klass.__dict__.get(name, _MISSING)
        if found is not _MISSING:
            return found
    return _MISSING


def _library_identity(value: Any) -> Any:
    """What a library object is, without running it: its type and, for a function, method,
    descriptor or class, the module and qualified name it was defined under; a plain value by
    value. Another object put in its place (an alias of another function) differs."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if type(value) in _EXACT_PLAIN:
        return [_EXACT_PLAIN[type(value)], repr(value)]
    if isinstance(value, _TORCH_PLAIN):
        return [type(value).__name__, str(value)]
    kind = _type_name(type(value))
    if isinstance(value, types.ModuleType):
        return [kind, value.__name__]
    try:
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        owner = getattr(value, "__objclass__", None)
        module = getattr(owner if owner is not None else value, "__module__", None)
    except Exception:  # NOTE: a lazy namespace's __getattr__ (torch.ops)
        return [kind]
    return [kind, str(module), name] if isinstance(name, str) else [kind]


def _named_attrs(
    value: Any,
    names: frozenset[str],
    h: Any,
    memo: dict[int, Any],
    seen: set[int],
    what: str,
) -> None:
    """Digest the attributes the code names of ``value`` when it is a module (recursively:
    ``pkg.config.SCALE``) or a user function (``helper.scale``). Of a PyTorch or standard
    library module, only attributes that user code replaced (``F.gelu = my_gelu``) count."""
    if id(value) in seen:
        return
    if isinstance(value, types.ModuleType):
        seen.add(id(value))
        pinned = is_pinned(value.__name__)
        namespace = vars(value)
        for attr in sorted(a for a in names if a in namespace):
            inner = namespace[attr]
            here = f"{what}.{attr}"
            with gate(attr):
                if not pinned:
                    h.update(repr((here, _value_fp(inner, here, memo))).encode())
                elif _user_defined(inner):
                    h.update(repr(("replaced", here, _fp(inner, here, memo, 0))).encode())
                else:  # NOTE: another library object put there (`F.silu = torch.tanh`)
                    h.update(repr(("library", here, _library_identity(inner))).encode())
                _named_attrs(inner, names, h, memo, seen, here)
    elif isinstance(value, types.FunctionType) and _user_defined(value):
        seen.add(id(value))
        namespace = vars(value)
        for attr in sorted(a for a in names if a in namespace and a != "__wrapped__"):
            here = f"{what}.{attr}"
            with gate(attr):
                h.update(repr((here, _fp(namespace[attr], here, memo, 0))).encode())


def _value_fp(value: Any, what: str, memo: dict[int, Any]) -> Any:
    """A global's fingerprint: a module by name (:func:`_named_attrs` checks what is named of
    it), anything else by :func:`fingerprint`."""
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    return _fp(value, what, memo, 0)


def _user_defined(value: Any) -> bool:
    if isinstance(value, types.FunctionType):
        return not (is_pinned(value.__module__ or "") and is_pinned(_globals_name(value)))
    if isinstance(value, (type, types.MethodType)):
        return not is_pinned(getattr(value, "__module__", None) or "")
    return False


def _globals_name(fn: types.FunctionType) -> str:
    return str(fn.__globals__.get("__name__", ""))


def class_digest(cls: type) -> str:
    """SHA-256 over a class's fingerprint (bases, attributes, methods by name, dataclass and
    namedtuple fields): what its generated methods and its readers depend on."""
    return class_orders(cls)[0]


def class_orders(cls: type) -> tuple[str, list[SetOrder]]:
    """:func:`class_digest`, and the iteration orders of the sets it describes."""
    with collecting() as orders:
        fp = _fp(cls, _qualified(cls), {}, 0)
        return "class:" + hashlib.sha256(repr(fp).encode()).hexdigest(), orders


# --- fingerprints ---------------------------------------------------------------------------
_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_TORCH_PLAIN = (
    torch.dtype,
    torch.device,
    torch.Size,
    torch.layout,
    torch.memory_format,
    torch.qscheme,
)


def fingerprint(value: Any, what: str, memo: dict[int, Any] | None = None) -> Any:
    """A process-independent, comparable description of ``value``; raises :class:`Unpinnable`
    for an object whose state cannot be described (``what`` names it in the message)."""
    return _fp(value, what, {} if memo is None else memo, 0)


# NOTE: exact builtin types (not subclasses, not enums): what _fp gives them, without the
# chain of checks below (most module attributes are these, or tuples of them).
_EXACT_PLAIN = {t: t.__name__ for t in _PLAIN}


def _fp(value: Any, what: str, memo: dict[int, Any], depth: int) -> Any:
    cls = type(value)
    if cls in _EXACT_PLAIN:
        return [_EXACT_PLAIN[cls], repr(value)]
    if cls is tuple and all(type(v) in _EXACT_PLAIN for v in value):
        return ["tuple", [[_EXACT_PLAIN[type(v)], repr(v)] for v in value]]
    if depth > _MAX_DEPTH:
        raise Unpinnable(f"{what} is nested too deeply (or holds itself)")
    if isinstance(value, enum.Enum):
        cls = type(value)
        _check_found(cls, what)
        return ["enum", _qualified(cls), value.name, _fp(value.value, what, memo, depth + 1)]
    if isinstance(value, _PLAIN):
        return [_type_name(type(value)), repr(value)]
    if isinstance(value, _TORCH_PLAIN):
        return [type(value).__name__, str(value)]
    if isinstance(value, torch.Tensor):
        raise Unpinnable(f"{what} is a tensor that is neither parameter nor buffer")
    if isinstance(value, (tuple, list, set, frozenset, dict)):
        return _container_fp(value, what, memo, depth)
    if isinstance(value, types.ModuleType):
        if not is_pinned(value.__name__):
            # NOTE: a module a function names as a global has the attributes it names checked
            # (function_digest); one held elsewhere (`self.cfg = config`) would not
            raise Unpinnable(
                f"{what} is the module {value.__name__}, whose attributes plait cannot check "
                "there (import it where it is used)"
            )
        return ["module", value.__name__]
    if isinstance(value, type):
        return _class_fp(value, what, memo, depth)
    if isinstance(value, functools.partial):
        return [
            "partial",
            _fp(value.func, what, memo, depth + 1),
            _fp(value.args, what, memo, depth + 1),
            _fp(value.keywords, what, memo, depth + 1),
            _fp(vars(value), what, memo, depth + 1),
        ]
    if isinstance(value, types.FunctionType):
        return _function_fp(value, what, memo, depth)
    if isinstance(value, types.MethodType):
        bound = value.__self__
        if not isinstance(bound, type):
            raise Unpinnable(
                f"{what} is a method bound to a {_qualified(type(bound))} object, whose state "
                "plait cannot check"
            )
        return [
            "method",
            _fp(bound, what, memo, depth + 1),
            _fp(value.__func__, what, memo, depth + 1),
        ]
    if dataclasses.is_dataclass(value):
        # NOTE: a config object: its class (fields, methods by name) and its values
        fields = dataclasses.fields(value)
        names = {f.name for f in fields}
        extra = {k: v for k, v in getattr(value, "__dict__", {}).items() if k not in names}
        return [
            "dataclass",
            _fp(type(value), what, memo, depth + 1),
            [[f.name, _fp(getattr(value, f.name), what, memo, depth + 1)] for f in fields],
            [[k, _fp(v, what, memo, depth + 1)] for k, v in extra.items()],
        ]
    if isinstance(value, types.SimpleNamespace):
        items = vars(value).items()
        return ["namespace", [[k, _fp(v, what, memo, depth + 1)] for k, v in items]]
    if isinstance(value, nn.Module):
        raise Unpinnable(
            f"{what} is a module outside the module tree (hold modules in nn.ModuleList or "
            "nn.ModuleDict, or as attributes)"
        )
    if isinstance(value, logging.Logger):
        # NOTE: a logger only decides what is logged; its level is what code may branch on
        return ["logger", value.name, value.getEffectiveLevel()]
    if is_pinned(type(value).__module__ or "") and callable(value):
        # NOTE: builtins, torch's and the standard library's callables (torch.ops, ufuncs) by
        # name; one bound to an object (`tensor.add`, `random.random`) by that object too.
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        if isinstance(name, str):
            out = ["callable", _qualified(type(value)), f"{getattr(value, '__module__', '')}"]
            out.append(name)
            bound = getattr(value, "__self__", None)
            if bound is not None and not isinstance(bound, (type, types.ModuleType)):
                out.append(_fp(bound, f"{what} (the object it is bound to)", memo, depth + 1))
            wrapped = getattr(value, "__wrapped__", None)
            if wrapped is not None:
                out.append(_fp(wrapped, what, memo, depth + 1))
            return out
    raise Unpinnable(f"{what} is a {_qualified(type(value))}, whose state plait cannot check")


def _type_name(cls: type) -> str:
    return cls.__name__ if cls.__module__ == "builtins" else _qualified(cls)


def _container_fp(value: Any, what: str, memo: dict[int, Any], depth: int) -> Any:
    cls = type(value)
    tag: Any = cls.__name__
    if cls.__module__ != "builtins":
        # NOTE: a namedtuple's fields, a subclass's methods: its class's contents
        tag = _fp(cls, what, memo, depth + 1)
    if isinstance(value, dict):
        items = [
            [_fp(k, what, memo, depth + 1), _fp(v, what, memo, depth + 1)] for k, v in value.items()
        ]
        if isinstance(value, defaultdict):
            items.append(_fp(value.default_factory, what, memo, depth + 1))
        return [tag, items]
    if not isinstance(value, (set, frozenset)):
        return [tag, [_fp(v, what, memo, depth + 1) for v in value]]
    # NOTE: a set in sorted order: its iteration order (the hash seed's for strings, and one
    # that may follow the order of insertion) is kept aside (plait.snapshots.set_order), with
    # the names code reads to reach it: what a loop over it sees
    fps, keys, nested = [], [], []
    for v in value:
        start = set_order.mark()
        fp = _fp(v, what, memo, depth + 1)
        fps.append(fp)
        keys.append(repr(fp))
        nested.append(set_order.take(start))
    return [tag, [fps[i] for i in set_order.record(keys, nested, what)]]


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_found(obj: Any, what: str) -> None:
    """A user class or function must be the one its module names now (not an older
    definition, not one made inside a function): what another process would find."""
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", "")
    if is_pinned(module):
        return
    if "<" in qualname:
        raise Unpinnable(f"{what} ({qualname}) is defined inside a function or is a lambda")
    if not _reachable(lookup(module, qualname), obj):
        raise Unpinnable(
            f"{what} ({module}.{qualname}) is not the one its module defines under that name now "
            "(redefined or reloaded since it was made)"
        )


def _function_fp(fn: types.FunctionType, what: str, memo: dict[int, Any], depth: int) -> Any:
    name = f"{fn.__module__}.{fn.__qualname__}"
    out: list[Any] = ["function", name]
    origin = f"{_globals_name(fn)}.{fn.__code__.co_qualname}"
    if origin != name:
        out.append(origin)  # NOTE: a decorator's wrapper, by the code it runs
    if fn.__closure__ and is_pinned(_globals_name(fn)):
        # NOTE: a library's code runs unrecorded: what its wrapper closes over (the function
        # it wraps, the context it enters: torch.no_grad or torch.enable_grad) counts
        out.append([_cell_fp(c, what, memo, depth) for c in fn.__closure__])
    if "<" in fn.__qualname__:
        # NOTE: a lambda or nested function of user code cannot be found again by name, but
        # it is harmless unless it runs, and the recorder refuses the program when it does.
        return out
    if not _found_as_its_code(fn):
        _check_found(fn, what)
    return out


def _found_as_its_code(fn: types.FunctionType) -> bool:
    """Whether the module ``fn``'s code belongs to names ``fn`` (or a function ``fn`` copies)
    under the code's qualified name: a library's ``@wraps(other)`` method, or a copy of a
    function made to carry its own docstring (transformers' ``PreTrainedModel.push_to_hub``),
    has another function's ``__module__`` and ``__qualname__`` but is found where its code is."""
    module, qualname = _globals_name(fn), fn.__code__.co_qualname
    if "<" in qualname or is_pinned(module):
        return False
    found = lookup(module, qualname)
    return _reachable(found, fn) or _a_copy_of(found, fn)


def _cell_fp(cell: Any, what: str, memo: dict[int, Any], depth: int) -> Any:
    try:
        value = cell.cell_contents
    except ValueError:  # NOTE: an empty cell
        return None
    if depth > _MAX_DEPTH:
        raise Unpinnable(f"{what} is nested too deeply (or holds itself)")
    if isinstance(value, types.FunctionType) and is_pinned(_globals_name(value)):
        # NOTE: a library's inner function (singledispatch's `dispatch`): what it closes over
        cells = [_cell_fp(c, what, memo, depth + 1) for c in value.__closure__ or ()]
        return ["function", f"{_globals_name(value)}.{value.__qualname__}", cells]
    try:
        return _fp(value, what, memo, depth + 1)
    except Unpinnable:
        owner = getattr(value, "__self__", value)
        if not is_pinned(type(owner).__module__ or ""):
            raise
        return ["object", _qualified(type(owner))]  # NOTE: a library object, by its class


def _class_fp(cls: type, what: str, memo: dict[int, Any], depth: int) -> Any:
    name = _qualified(cls)
    if is_pinned(cls.__module__ or ""):
        return ["class", name]
    _check_found(cls, what)
    if id(cls) in memo:
        return ["class", name]  # NOTE: its contents are written where it was first met
    memo[id(cls)] = cls
    return ["class", name, _class_contents(cls, memo, depth)]


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
        "__firstlineno__",
        "_abc_impl",
        # NOTE: sets of names that follow from the methods (and iterate in a hash-seeded order)
        "__abstractmethods__",
        "__protocol_attrs__",
        "__non_callable_proto_members__",
    }
)


def _class_contents(cls: type, memo: dict[int, Any], depth: int) -> Any:
    """A user class's bases and the attributes of its user bases: values, methods by name (an
    override added or removed changes it), dataclass fields."""
    attrs: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if base is object or is_pinned(base.__module__ or ""):
            continue
        if base is not cls:
            _check_found(base, f"{_qualified(cls)}'s base")
        for key, value in vars(base).items():
            if key in _CLASS_SKIP:
                continue
            where = f"{_qualified(base)}.{key}"
            # NOTE: code reaches a class attribute by its name (a dunder one, such as
            # __dataclass_fields__, also through the class: the library's code reads it)
            with gate(key, reset=not (key.startswith("__") and key.endswith("__"))):
                fp = _member_fp(base, key, value, where, memo, depth)
            attrs[f"{base.__qualname__}.{key}"] = fp
    return [[_qualified(b) for b in cls.__mro__], [[k, attrs[k]] for k in sorted(attrs)]]


def _member_fp(
    base: type, key: str, value: Any, where: str, memo: dict[int, Any], depth: int
) -> Any:
    if isinstance(value, types.FunctionType):
        if value.__qualname__ == f"{base.__qualname__}.{key}" and not value.__closure__:
            # NOTE: defined in this class's body (found with it); its code is digested if it runs
            return ["function", f"{_globals_name(value)}.{value.__code__.co_qualname}"]
        return _function_fp(value, where, memo, depth)
    if isinstance(value, (staticmethod, classmethod)):
        inner = _member_fp(base, key, value.__func__, where, memo, depth)
        return [type(value).__name__, inner]
    if isinstance(value, property):
        return [
            "property",
            [
                None if f is None else _member_fp(base, key, f, where, memo, depth)
                for f in (value.fget, value.fset, value.fdel)
            ],
        ]
    if isinstance(value, functools.cached_property):
        return ["cached_property", _member_fp(base, key, value.func, where, memo, depth)]
    if isinstance(value, (types.MemberDescriptorType, types.GetSetDescriptorType)):
        return ["slot"]  # NOTE: follows from __slots__
    if type(value).__qualname__ == "_tuplegetter":
        return ["field", value.__doc__]  # NOTE: follows from _fields
    if key == "__dataclass_fields__" and isinstance(value, dict):
        return [_field_fp(f, where, memo, depth) for f in value.values()]
    if key == "__dataclass_params__":
        return repr(value)
    return _fp(value, where, memo, depth + 1)


def _field_fp(f: Any, where: str, memo: dict[int, Any], depth: int) -> Any:
    missing = dataclasses.MISSING
    return [
        f.name,
        str(f._field_type),
        None if f.default is missing else _fp(f.default, where, memo, depth + 1),
        None if f.default_factory is missing else _fp(f.default_factory, where, memo, depth + 1),
        f.init,
        None if f.kw_only is missing else f.kw_only,  # NOTE: a ClassVar pseudo-field's
    ]

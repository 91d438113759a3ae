"""Value keys and roots of the Python values a capture reads (:mod:`plait.frontend.pyreads`
records them), and the guard over them.

A *root* is a place the program read (a module's instance dict and a name, a global, a closure
cell, a function's defaults, a class attribute) that can be read again; :func:`value_key` says
what its value is compared by: plain values by value (floats by their IEEE-754 bits), containers
and user objects (dataclasses, ``SimpleNamespace``, Hugging Face ``PretrainedConfig`` ...) by
their contents recursively, tensors, modules, functions, classes and library objects by
identity. :func:`python_values_guard` turns roots into one guard whose native form
(:class:`~plait.guards.guard.ReadPyValues`) checks identities and version tags, and whose
Python read compares value keys. :func:`plait.frontend.saved_roots.resolve` finds a root again
from its saved description.

Example:
    >>> value_key(0.0) == value_key(-0.0), value_key([1, 2.5]) == value_key([1, 2.5])
    (False, True)
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from plait.errors import GraphCaptureError, NotSavableError
from plait.frontend.code_origin import (
    IMPORT_METADATA,
    is_import_machinery,
    is_pinned,
)
from plait.frontend.mutable_library_values import (
    array_key,
    container_key,
    iterator_key,
    library_key,
)
from plait.frontend.process_reads import rng_state
from plait.frontend.pyvalue_changes import changed_at, short
from plait.guards.guard import Guard, GuardEnv, ReadPyValues
from plait.guards.guard import float_bits as _bits


class _Absent:
    """The value of a root that holds nothing (an attribute not set, a global not defined)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


class Same:
    """A value compared by identity in a value key (a tensor, a module, a function)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __repr__(self) -> str:
        name = getattr(self.obj, "__qualname__", None)
        if isinstance(name, str):
            return f"<{type(self.obj).__name__} {name}>"
        return f"<a {type(self.obj).__name__} object at {id(self.obj):#x}>"


# NOTE: native check kinds (plait.guards native evaluator, op PYVALUES)
ITEMS, CELL, FUNC, TYPE, DICT, LIST, PYTHON, TYPEATTRS = range(8)
SET = 9  # NOTE: ``(9, s, items)``: s is an exact set holding exactly those items
_MAX_DEPTH = 24
# NOTE: guarded elsewhere: parameters, buffers, submodules (state guards), training flags
_MODULE_SKIP = frozenset({"_parameters", "_buffers", "_modules", "training", "__class__"})
_IMMUTABLE = (type(None), bool, int, str, bytes, torch.dtype, torch.device, torch.layout)


def _is_user_class(cls: type) -> bool:
    return not is_pinned(getattr(cls, "__module__", "") or "")


def _mro_lookup(cls: type, name: str) -> Any:
    """What ``name`` finds on ``cls`` (its MRO's namespaces, as attribute lookup sees them)."""
    for base in cls.__mro__:
        found = vars(base).get(name, ABSENT)
        if found is not ABSENT:
            return found
    return ABSENT


def _identity_set(v: Any) -> bool:
    """Whether a set's membership alone decides its key: an exact set of exact strings and of
    classes whose metaclass compares and hashes as ``type`` does, by identity (a string by its
    value, which is its key; an int would not do: ``True in {1}``)."""
    return type(v) is set and all(type(x) is str or _identity_class(x) for x in v)


def _identity_class(x: Any) -> bool:
    meta = type(x)
    return isinstance(x, type) and meta.__eq__ is type.__eq__ and meta.__hash__ is type.__hash__


class _Walk:
    """One value-key walk: the native checks it needs and the objects whose named attributes
    count (user objects, Python modules, classes)."""

    def __init__(self) -> None:
        self.checks: list[tuple[Any, ...]] = []
        self.hosts: list[Any] = []
        self.seen: dict[int, int] = {}
        self.keep: list[Any] = []

    def key(self, v: Any, depth: int = 0, shallow: bool = False) -> Any:
        cls = type(v)
        if cls is float or isinstance(v, float):
            return (cls, "bits", _bits(v))
        if isinstance(v, complex):
            return (cls, "bits", _bits(v.real), _bits(v.imag))
        if isinstance(v, _IMMUTABLE) and not isinstance(v, enum.Enum):
            return (cls, v)
        if isinstance(v, enum.Enum):
            return (cls, v.name)
        if v is ABSENT:
            return "<absent>"
        if cls is torch.Tensor or cls is nn.Parameter:
            # NOTE: and the Python attributes set on it (w.gain), absent ones too: a tensor
            # subclass (a tracer) is by identity alone
            own = v.__dict__
            self.checks.append((DICT, own, tuple(own), tuple(own.values())))
            return ("tensor", Same(v), tuple((k, self.key(x, depth + 1)) for k, x in own.items()))
        if isinstance(v, (torch.Tensor, nn.Module, types.FunctionType, types.CodeType)):
            return Same(v)
        if isinstance(v, (type, types.ModuleType)):
            self.hosts.append(v)
            return Same(v)
        if isinstance(v, types.MethodType):
            return ("method", Same(v.__func__), self.key(v.__self__, depth + 1, shallow))
        found = library_key(v, lambda x: self.key(x, depth + 1), Same)
        if found is not None:  # NOTE: a logger, a getter of process state, a functools cache
            self.checks += found[1]
            self.hosts += found[2]
            return found[0]
        state = rng_state(v)
        if state is not None:  # NOTE: a random generator object: by its state
            self.checks.append((PYTHON,))
            return (cls, "rng", state)
        contents = array_key(v)
        if contents is None and not shallow:
            contents = container_key(v, lambda x: self.key(x, depth + 1))
        if contents is not None:  # NOTE: a NumPy array, a deque ...: by contents, each call
            self.checks.append((PYTHON,))
            return contents
        if callable(v) and not _is_user_class(cls) and not _is_data(v):
            return Same(v)  # NOTE: a library's callable (a builtin, a torch op)
        position = None if shallow else iterator_key(v, lambda p: self.key(p, depth + 1))
        if position is not None:  # NOTE: an iterator: by its position, read on every call
            self.checks.append((PYTHON,))
            return position
        if depth > _MAX_DEPTH:
            raise GraphCaptureError(
                "Python state",
                f"a {cls.__name__} the program reads is nested too deeply to guard",
                kind="limitation",
            )
        if id(v) in self.seen:
            return ("cycle", self.seen[id(v)])
        if isinstance(v, tuple):
            return (cls, tuple(self.key(x, depth + 1, shallow) for x in v))
        if isinstance(v, frozenset):
            return (cls, frozenset(self.key(x, depth + 1, shallow) for x in v))
        if shallow and not _is_user_class(cls) and not _plain_list(v):
            return Same(v)  # NOTE: a library's object (a library module's attribute)
        self.seen[id(v)] = len(self.seen)
        self.keep.append(v)
        if isinstance(v, list):
            self.checks.append((LIST, v, tuple(v)) if cls is list else (PYTHON,))
            return (cls, tuple(self.key(x, depth + 1) for x in v))
        if isinstance(v, dict):
            native = cls is dict or cls is OrderedDict
            self.checks.append((DICT, v, tuple(v), tuple(v.values())) if native else (PYTHON,))
            items = tuple((self.key(k, depth + 1), self.key(x, depth + 1)) for k, x in v.items())
            extra = self.key(v.default_factory, depth + 1) if hasattr(v, "default_factory") else ()
            return (cls, items, extra)
        if isinstance(v, (set, frozenset)):
            self.checks.append((SET, v, tuple(v)) if _identity_set(v) else (PYTHON,))
            return (cls, frozenset(self.key(x, depth + 1) for x in v))
        if isinstance(v, functools.partial):
            self.checks.append((PYTHON,))
            return (cls, self.key((v.func, v.args, v.keywords), depth + 1))
        return self._object(v, cls, depth)

    def _object(self, v: Any, cls: type, depth: int) -> Any:
        namespace = getattr(v, "__dict__", None)
        slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if s != "__dict__"]
        if not _is_value_object(v, cls):
            return Same(v)  # NOTE: a library's object: by identity (documented)
        self.hosts.append(v)
        self.checks.append((TYPE, v, cls))
        parts: list[Any] = [Same(cls)]
        if isinstance(namespace, dict):
            self.checks.append(
                (DICT, namespace, tuple(namespace), tuple(namespace.values()))
                if type(namespace) is dict
                else (PYTHON,)
            )
            parts.append(tuple((k, self.key(x, depth + 1)) for k, x in namespace.items()))
        if slots:
            self.checks.append((PYTHON,))
            parts.append(tuple(self.key(getattr(v, s, ABSENT), depth + 1) for s in slots))
        return ("object", *parts)


def _plain_list(v: Any) -> bool:
    """A list of plain values (``sys.argv``): by its items even as a library's attribute."""
    return type(v) is list and all(type(x) in _PLAIN_KEYED or type(x) is float for x in v)


def _is_value_object(v: Any, cls: type) -> bool:
    """Whether ``v`` is compared by its contents: an object of a user class, a
    ``SimpleNamespace``, a dataclass instance (a library's other objects: by identity; so is
    an object of the import system, a loader or finder, whatever package defines it)."""
    if _is_user_class(cls):
        return not is_import_machinery(v)
    return isinstance(v, types.SimpleNamespace) or _is_data(v)


def _is_data(v: Any) -> bool:
    """A callable that is also a value container (a dataclass or user object with __call__)."""
    return dataclasses.is_dataclass(v) and not isinstance(v, type)


# NOTE: exact types whose value key is ``(type, value)`` (no walk needed: no checks, no hosts)
_PLAIN_KEYED = frozenset({type(None), bool, int, str})


def quick_key(v: Any, shallow: bool = False) -> Any:
    """``_Walk().key(v, shallow=shallow)``, without a walk's setup for the values a module
    attribute mostly holds (numbers, strings, None, tuples of them, an empty hook dict)."""
    cls = type(v)
    if cls in _PLAIN_KEYED:
        return (cls, v)
    if cls is float:
        return (cls, "bits", _bits(v))
    if v is ABSENT:
        return "<absent>"
    if cls is tuple and all(type(x) in _PLAIN_KEYED for x in v):
        return (cls, tuple((type(x), x) for x in v))
    if (cls is OrderedDict or cls is dict) and not v and not shallow:
        return (cls, (), ())
    return _Walk().key(v, shallow=shallow)


def value_key(v: Any) -> Any:
    """What a Python value is compared by (see the module doc).

    Example:
        >>> value_key(0.0) == value_key(-0.0), value_key(float("nan")) == value_key(float("nan"))
        (False, True)
    """
    return _Walk().key(v)


@dataclass
class Root:
    """One place the program read: ``read()`` reads it again now; ``desc`` finds it again in
    another process (None: it cannot be, e.g. a closure cell); ``show`` names it for a user;
    ``identity``: its value is compared by identity alone (a module's import metadata)."""

    show: str
    read: Callable[[], Any]
    desc: list[Any] | None
    native: Callable[[Any], tuple[Any, ...]]  # (captured value) -> the native check(s)
    shallow: bool = False
    first: Any = None  # the value key at the first read (a change during capture is refused)
    names: frozenset[str] = field(default_factory=frozenset)
    identity: bool = False
    # NOTE: a value other code sets again to an equal one, often (os.environ: a cache directory
    # set per model, inductor's variable), fails the native identity check until the Python
    # read re-arms it: its guard of its own keeps that read to this root, not every value read
    alone: bool = False


def item_root(
    mapping: dict | types.MappingProxyType, key: str, show: str, desc: list | None, **kw: Any
) -> Root:
    def read() -> Any:
        return mapping.get(key, ABSENT)

    return Root(show, read, desc, lambda v: (ITEMS, mapping, (key,), (v,)), **kw)


def namespace_root(
    namespace: dict, name: str, show: str, desc: list | None, shallow: bool = False
) -> Root:
    """A name of a module namespace (or of the builtins): its import metadata by identity, and
    its ``__builtins__`` (whose entries are roots of their own: plait.frontend.namespace_reads)."""
    same = name in IMPORT_METADATA or name == "__builtins__"
    return item_root(namespace, name, show, desc, shallow=shallow, identity=same)


def names_root(namespace: dict, show: str, desc: list | None) -> Root:
    """The names a namespace holds (a program that reads it whole may look up one it lacks);
    natively its dict version, the Python read after a change (as :func:`table_names_root`)."""

    def read() -> Any:
        return repr(list(namespace))

    return Root(
        show, read, desc, lambda v: (DICT, namespace, tuple(namespace), tuple(namespace.values()))
    )


def tensor_dict_root(namespace: dict, show: str, desc: list | None) -> Root:
    """The whole instance dict of a tensor (``vars(self.weight)``): its names and values, by
    value (natively, its dict version tag and items)."""
    return Root(
        show,
        lambda: namespace,
        desc,
        lambda v: (DICT, namespace, tuple(namespace), tuple(namespace.values())),
    )


def typeattr_root(cls: type, name: str, show: str, desc: list | None) -> Root:
    return Root(
        show,
        lambda: _mro_lookup(cls, name),
        desc,
        lambda v: (TYPEATTRS, cls, (name,), (v,)),
        shallow=not _is_user_class(cls),
    )


def type_root(obj: Any, show: str, desc: list | None) -> Root:
    return Root(show, lambda: type(obj), desc, lambda v: (TYPE, obj, v))


def cell_root(cell: Any, show: str) -> Root:
    def read() -> Any:
        try:
            return cell.cell_contents
        except ValueError:
            return ABSENT

    return Root(show, read, None, lambda v: (CELL, cell, v))


def func_root(fn: types.FunctionType, show: str, desc: list | None) -> Root:
    def read() -> Any:
        return (fn.__code__, fn.__defaults__, fn.__kwdefaults__)

    return Root(show, read, desc, lambda v: (FUNC, fn, *v))


def dict_root(owner: Any, show: str, desc: list | None) -> Root:
    """The whole instance dict of ``owner`` (tables guarded elsewhere left out)."""

    def read() -> Any:
        d = object.__getattribute__(owner, "__dict__")
        return {k: v for k, v in d.items() if k not in _MODULE_SKIP}

    return Root(show, read, desc, lambda v: (PYTHON,))


def table_names_root(owner: Any, table: str, show: str, desc: list | None) -> Root:
    """The names a compiled module's parameter or buffer table holds, each marked where its
    slot holds None (the program iterated the table): the tensors in it are the module state,
    read each call, so a tensor rebound in a slot keeps the key. Natively, the table's items
    as they are when the guard is made (its dict version tag; the Python read after a change:
    nn.Module never replaces the table itself, only its items)."""

    def found() -> Any:
        return object.__getattribute__(owner, "__dict__").get(table, ABSENT)

    def read() -> Any:
        slots = found()
        if not isinstance(slots, dict):
            return slots
        # NOTE: one string (a readable reason): the repr of a list of strings is one-to-one
        return repr([k if v is not None else (k, None) for k, v in slots.items()])

    def native(v: Any) -> tuple[Any, ...]:
        slots = found()
        if type(slots) is dict or type(slots) is OrderedDict:
            return (DICT, slots, tuple(slots), tuple(slots.values()))
        return (PYTHON,)

    return Root(show, read, desc, native)


def environ_root() -> Root:
    """The environment's contents (``os.environ``'s dict; natively its version tag)."""
    return item_root(
        vars(os.environ), "_data", "the environment (os.environ)", ["environ"], alone=True
    )


def find_class(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names in this process (no import), or None."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
    return obj


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return ABSENT


# --- the guard --------------------------------------------------------------------------------
class Keyed(NamedTuple):
    """A root's value as read now, its value key, and the native checks and the hosts (objects
    whose named attributes count) of that key's walk: one walk serves the change check, the
    named attributes and the guard."""

    value: Any
    key: Any
    checks: list[tuple[Any, ...]]
    hosts: list[Any]


_keyed = tuple.__new__  # NOTE: a Keyed made without its Python __new__


def keyed(root: Root) -> Keyed:
    """``root`` read now, with its value key (a walk of its own, as the guard's read makes)."""
    value = root.read()
    if root.identity:
        return _keyed(Keyed, (value, Same(value), [], []))
    # NOTE: the walk's answer, without its setup, for the values most roots hold
    cls = type(value)
    if cls in _PLAIN_KEYED:
        return _keyed(Keyed, (value, (cls, value), [], []))
    if cls is float:
        return _keyed(Keyed, (value, (cls, "bits", _bits(value)), [], []))
    if value is ABSENT:
        return _keyed(Keyed, (value, "<absent>", [], []))
    if cls is types.FunctionType:
        return _keyed(Keyed, (value, Same(value), [], []))
    if (cls is OrderedDict or cls is dict) and not value and not root.shallow:
        return _keyed(Keyed, (value, (cls, (), ()), [(DICT, value, (), ())], []))
    walk = _Walk()
    key = walk.key(value, shallow=root.shallow)
    return _keyed(Keyed, (value, key, walk.checks, walk.hosts))


def python_values_guards(roots: Sequence[Root], keys: Sequence[Keyed] | None = None) -> list[Guard]:
    """The guards over ``roots`` (``keys``: each root :func:`keyed` just now, if the caller
    has them): the roots the native evaluator checks alone in one guard, the roots whose check
    needs a Python read (a set, a dict subclass, ...) in another, each root marked ``alone``
    (the environment) in its own. NOTE: a guard with any Python-read check re-reads all its
    roots on every call; split, one such value costs its own read, not a read of every value
    the program read."""
    keys = list(keys) if keys is not None else [keyed(r) for r in roots]
    assert len(keys) == len(roots)
    python: list[tuple[Root, Keyed]] = []
    native: list[tuple[Root, Keyed]] = []
    alone: list[list[tuple[Root, Keyed]]] = []
    for r, k in zip(roots, keys):
        if r.alone:
            alone.append([(r, k)])
            continue
        heads = _heads(r.native(k.value))
        read = any(c[0] == PYTHON for c in (*k.checks, *heads))
        (python if read else native).append((r, k))
    groups = (native, python, *alone)
    return [g for g in (python_values_guard(items) for items in groups) if g]


def python_values_guard(items: Sequence[tuple[Root, Keyed]]) -> Guard | None:
    """One guard over the roots of ``items``: holds while each root's value key is the one it
    has now (its :class:`Keyed`)."""
    if not items:
        return None
    roots = [r for r, _ in items]
    expected = tuple(k.key for _, k in items)

    def native_checks(keys: Sequence[Keyed]) -> tuple[tuple[Any, ...], ...]:
        heads = [h for r, k in zip(roots, keys) for h in _heads(r.native(k.value))]
        return _grouped(heads + [c for k in keys for c in k.checks])

    def read(env: GuardEnv) -> Any:
        # NOTE: a walk per root, as :func:`keyed` made the expected keys
        keys = [keyed(r) for r in roots]
        return _Read((k.key for k in keys), keys)

    def rearm(now: Any) -> tuple[tuple[Any, ...], ...] | None:
        # NOTE: ``now`` equals ``expected``: the checks of the objects it read imply it, as
        # the capture's did (an object read set again to an equal one fails its old check)
        if not isinstance(now, _Read):
            return None
        checks = native_checks(now.keyed)
        return None if any(c[0] == PYTHON for c in checks) else checks

    def detail(env: GuardEnv) -> str:
        now = read(env)
        changed = []
        for r, a, b in zip(roots, expected, now):
            if a != b:
                where, was, got = changed_at(a, b, r.show)
                changed.append(f"{where}: was {short(was)}, now {short(got)}")
        return "; ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")

    descs = [r.desc for r in roots]
    key = "python|" + repr(sorted(map(repr, descs)))
    checks = native_checks([k for _, k in items])
    armed = not any(c[0] == PYTHON for c in checks)  # NOTE: else the read runs every call
    return Guard(
        "python",
        "Python values read",
        f"the Python values the program read ({len(roots)}) are unchanged",
        expected,
        read,
        detail,
        fmt=lambda r: "as captured" if r is expected else "a change",
        key=key,
        native=ReadPyValues(checks, ABSENT, rearm if armed else None),
    )


class _Read(tuple):
    """A guard's read: the roots' value keys, and each root's :class:`Keyed` (its native
    checks), which re-arm the guard's native check."""

    keyed: list[Keyed]

    def __new__(cls, keys: Any, keyed: list[Keyed]) -> _Read:
        out = super().__new__(cls, keys)
        out.keyed = keyed
        return out


def _heads(native: tuple[Any, ...]) -> tuple[tuple[Any, ...], ...]:
    """A root's native checks: one check, or a tuple of them."""
    return native if native and isinstance(native[0], tuple) else (native,)


def _grouped(checks: list[tuple[Any, ...]]) -> tuple[tuple[Any, ...], ...]:
    """One check per mapping (per class) for the items read of it: one version load covers
    them all; duplicates (a container reached twice) once."""
    out: list[Any] = []
    merged: dict[tuple[int, int], tuple[list[Any], list[Any]]] = {}
    seen: set[tuple[Any, ...]] = set()
    for c in checks:
        kind = c[0]
        if kind in (ITEMS, TYPEATTRS):
            at = (kind, id(c[1]))
            slot = merged.get(at)
            if slot is None:
                slot = merged[at] = ([], [])
                out.append((kind, c[1], slot))
            slot[0].extend(c[2])
            slot[1].extend(c[3])
            continue
        if kind != PYTHON:  # NOTE: a Python-read check is kept each time
            ident = (kind, id(c[1]))
            if ident in seen:
                continue
            seen.add(ident)
        out.append(c)
    return tuple(
        (c[0], c[1], tuple(c[2][0]), tuple(c[2][1])) if c[0] in (ITEMS, TYPEATTRS) else c
        for c in out
    )


def saved_form(roots: Sequence[Root]) -> list[list[Any]]:
    """The roots' descriptions; raises ``ValueError`` for one that has none."""
    out = []
    for r in roots:
        if r.desc is None:
            raise NotSavableError(f"the program reads {r.show}, which has no saved form")
        out.append(r.desc)
    return out

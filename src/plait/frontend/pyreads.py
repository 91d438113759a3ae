"""The Python values a capture reads, recorded while it runs and guarded after it.

A captured graph bakes in what the program read of Python state: ``self.alpha`` becomes a literal,
``if CONFIG.use_bias:`` picks a branch. :class:`PyReads` records those reads during the trace:

- attribute reads on every ``nn.Module`` (``nn.Module.__getattribute__`` is instrumented while a
  capture runs, so the reads PyTorch's own ``forward`` makes, ``self.stride``, count too): the
  instance's value, or the class attribute it finds (methods, class constants, properties);
- for each function of user code that runs (a profile hook): the globals its code loads (and the
  builtins it falls back to), the attributes it names of global modules and classes, its closure
  cells, its defaults and its code object;
- the attributes that code names of any user object reached from those values (a config
  object's class constants).

Each read is a *root* (where it was read, so it can be read again) and its value is described
by :func:`value_key`: plain values by value (floats by their IEEE-754 bits), containers and
user objects (dataclasses, ``SimpleNamespace``, Hugging Face ``PretrainedConfig`` ...) by their
contents recursively, tensors, modules, functions, classes and library objects by identity.
:func:`python_values_guard` turns the roots into one guard: it holds while every root's value
key is the one capture saw; its native form checks identities and CPython's dict version tags
(a few nanoseconds per dict), and asks the Python read only after something was assigned.

A read that cannot be attributed is never ignored: a module class with its own
``__getattribute__`` (or a program that reads ``__dict__``) has its whole instance dict guarded;
code that calls ``globals()``, ``eval`` or ``exec`` has its whole module namespace guarded; a
function whose closure cannot be found, or a program that changes a value it read while it runs,
is refused (:class:`GraphCaptureError`, ``kind="limitation"``: the documented eager fallback).

Example:
    >>> import torch
    >>> lin = torch.nn.Linear(2, 2)
    >>> with PyReads(lin) as reads:
    ...     _ = lin(torch.ones(1, 2))
    >>> sorted(r.show for r in reads.finish())[:2]
    ['self._backward_hooks', 'self._backward_pre_hooks']
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import enum
import functools
import gc
import struct
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from plait.errors import GraphCaptureError
from plait.frontend.deps import generated_for
from plait.frontend.fingerprint import find_function, is_pinned
from plait.frontend.guards import Guard, GuardEnv, ReadPyValues


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
_MAX_DEPTH = 24
# NOTE: guarded elsewhere: parameters, buffers, submodules (state guards), training flags
_MODULE_SKIP = frozenset({"_parameters", "_buffers", "_modules", "training", "__class__"})
_WHOLE_NAMESPACE = frozenset({"globals", "eval", "exec", "vars", "locals", "__import__"})
_IMMUTABLE = (type(None), bool, int, str, bytes, torch.dtype, torch.device, torch.layout)


def _bits(x: float) -> int:
    return int(struct.unpack("<q", struct.pack("<d", x))[0])


def _is_user_class(cls: type) -> bool:
    return not is_pinned(getattr(cls, "__module__", "") or "")


def _mro_lookup(cls: type, name: str) -> Any:
    """What ``name`` finds on ``cls`` (its MRO's namespaces, as attribute lookup sees them)."""
    for base in cls.__mro__:
        found = vars(base).get(name, ABSENT)
        if found is not ABSENT:
            return found
    return ABSENT


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
        if isinstance(v, (torch.Tensor, nn.Module, types.FunctionType, types.CodeType)):
            return Same(v)
        if isinstance(v, (type, types.ModuleType)):
            self.hosts.append(v)
            return Same(v)
        if isinstance(v, types.MethodType):
            return ("method", Same(v.__func__), self.key(v.__self__, depth + 1, shallow))
        if callable(v) and not _is_user_class(cls) and not _is_data(v):
            return Same(v)  # NOTE: a library's callable (a builtin, a torch op)
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
        if shallow and not _is_user_class(cls):
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
            self.checks.append((PYTHON,))
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


def _is_value_object(v: Any, cls: type) -> bool:
    """Whether ``v`` is compared by its contents: an object of a user class, a
    ``SimpleNamespace``, a dataclass instance (a library's other objects: by identity)."""
    return _is_user_class(cls) or isinstance(v, types.SimpleNamespace) or _is_data(v)


def _is_data(v: Any) -> bool:
    """A callable that is also a value container (a dataclass or user object with __call__)."""
    return dataclasses.is_dataclass(v) and not isinstance(v, type)


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
    another process (None: it cannot be, e.g. a closure cell); ``show`` names it for a user."""

    show: str
    read: Callable[[], Any]
    desc: list[Any] | None
    native: Callable[[Any], tuple[Any, ...]]  # (captured value) -> the native check
    shallow: bool = False
    first: Any = None  # the value key at the first read (a change during capture is refused)
    names: frozenset[str] = field(default_factory=frozenset)


def item_root(
    mapping: dict | types.MappingProxyType, key: str, show: str, desc: list | None, **kw: Any
) -> Root:
    def read() -> Any:
        return mapping.get(key, ABSENT)

    return Root(show, read, desc, lambda v: (ITEMS, mapping, (key,), (v,)), **kw)


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


# --- recording -----------------------------------------------------------------------------
_LOCAL = threading.local()
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = [0]


def _recording_getattribute(self: Any, name: str) -> Any:
    value = object.__getattribute__(self, name)
    rec = getattr(_LOCAL, "rec", None)
    if rec is not None and not (name == "__dict__" and _library_caller()):
        _LOCAL.rec = None  # NOTE: the recorder's own reads are not the program's
        try:
            rec.module_read(self, name)
        finally:
            _LOCAL.rec = rec
    return value


def find_class(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names in this process (no import), or None."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
    return obj


def _library_caller() -> bool:
    """Whether the attribute read comes from PyTorch's (or plait's) own code: their reads of
    ``__dict__`` (``nn.Module.__getattr__`` finding parameters) are not the program's."""
    frame = sys._getframe(2)
    return is_pinned(str(frame.f_globals.get("__name__", "")))


_MODULE_GETATTR = nn.Module.__getattr__


def _recording_getattr(self: Any, name: str) -> Any:
    """``nn.Module.__getattr__`` (parameters, buffers, submodules): a slot holding None is a
    Python value the program read (``if self.bias is not None``); a tensor or a submodule is
    guarded by the state guards."""
    value = _MODULE_GETATTR(self, name)
    rec = getattr(_LOCAL, "rec", None)
    if rec is not None and value is None:
        _LOCAL.rec = None
        try:
            rec.table_read(self, name)
        finally:
            _LOCAL.rec = rec
    return value


def _instrument(on: bool) -> None:
    with _PATCH_LOCK:
        _PATCH_USERS[0] += 1 if on else -1
        if on and _PATCH_USERS[0] == 1:
            nn.Module.__getattribute__ = _recording_getattribute  # type: ignore[method-assign]
            nn.Module.__getattr__ = _recording_getattr  # type: ignore[method-assign]
        elif not on and _PATCH_USERS[0] == 0:
            del nn.Module.__getattribute__
            nn.Module.__getattr__ = _MODULE_GETATTR  # type: ignore[method-assign]


@functools.lru_cache(maxsize=4096)
def _global_loads(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` loads as globals (nested comprehensions included)."""
    out: list[str] = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
            out.append(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType) and c.co_name.startswith("<") and c.co_name != "<lambda>":
            out.extend(_global_loads(c))
    return tuple(dict.fromkeys(out))


@functools.lru_cache(maxsize=4096)
def _attr_names(code: types.CodeType) -> frozenset[str]:
    """The attribute names ``code`` uses and its identifier-like string constants."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _attr_names(c)
        elif isinstance(c, str) and c.isidentifier():
            out.add(c)
    return frozenset(out)


class PyReads:
    """Records the Python values a capture reads (see the module doc); ``module`` is the
    compiled module (its submodules' paths name their roots), if any."""

    def __init__(self, module: nn.Module | None = None, program: Any = None) -> None:
        # NOTE: the program function's own defaults are applied to the call's arguments (and
        # guarded there): its closure is what is read of it
        self.program = program
        self.paths: dict[int, str] = {}
        self.tree: list[nn.Module] = []
        if module is not None:
            for path, m in module.named_modules(remove_duplicate=False):
                self.paths.setdefault(id(m), path)
                self.tree.append(m)
        self.roots: dict[tuple[Any, ...], Root] = {}
        self.names: set[str] = set()
        self.refusal: str | None = None
        self._reads: set[tuple[int, str]] = set()
        self._codes: set[int] = set()
        self._alive: list[Any] = []
        self._previous: Any = None
        self._active = False
        self._tracing = False
        self._gc_was_enabled = False

    # -- entering and leaving
    def __enter__(self) -> PyReads:
        for m in self.tree:
            if type(m).__getattribute__ is not nn.Module.__getattribute__:
                # NOTE: a class of its own __getattribute__ may read around the instrument
                self._add(("dict", id(m)), dict_root(m, self._where(m), self._desc(m, "dict")))
        _instrument(True)
        # NOTE: a global trace function sees each new frame once and nothing else (no C calls,
        # no line events: it returns None); where a tracer is active already (a debugger,
        # coverage), a profile hook chained to the one in place sees the frames instead.
        self._tracing = sys.gettrace() is None
        self._previous = sys.getprofile()
        previous = self._previous

        def trace(frame: types.FrameType, event: str, arg: Any) -> None:
            if event == "call" and id(frame.f_code) not in self._codes:
                self._frame(frame)

        def hook(frame: types.FrameType, event: str, arg: Any) -> None:
            if previous is not None:
                previous(frame, event, arg)
            if event == "call" and id(frame.f_code) not in self._codes:
                self._frame(frame)

        # NOTE: no cyclic collection while recording: what it runs (gc callbacks, __del__ of
        # unrelated garbage) is not the program's code (as for plait.frontend.deps)
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        _LOCAL.rec = self
        if self._tracing:
            sys.settrace(trace)
        else:
            sys.setprofile(hook)
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            if self._tracing:
                sys.settrace(None)
            else:
                sys.setprofile(self._previous)
            _LOCAL.rec = None
            _instrument(False)
            if self._gc_was_enabled:
                gc.enable()
            self._active = False

    # -- what is read
    def _where(self, m: Any) -> str:
        path = self.paths.get(id(m))
        if path is None:
            return f"a {type(m).__name__} module outside the compiled module"
        return f"self.{path}" if path else "self"

    def _desc(self, m: Any, kind: str, *rest: Any) -> list[Any] | None:
        path = self.paths.get(id(m))
        return None if path is None else [kind, path, *rest]

    def _add(self, key: tuple[Any, ...], root: Root) -> None:
        if key in self.roots:
            return
        try:
            root.first = _Walk().key(root.read(), shallow=root.shallow)
        except GraphCaptureError as exc:
            self.refusal = self.refusal or exc.reason
            return
        self.roots[key] = root

    def module_read(self, m: nn.Module, name: str) -> None:
        if (id(m), name) in self._reads or name in _MODULE_SKIP:
            return
        self._reads.add((id(m), name))
        self._alive.append(m)
        where = self._where(m)
        namespace = object.__getattribute__(m, "__dict__")
        if name == "__dict__":
            self._add(("dict", id(m)), dict_root(m, where, self._desc(m, "dict")))
            return
        if ("type", id(m)) not in self.roots:
            self._add(("type", id(m)), type_root(m, f"type({where})", self._desc(m, "type")))
        show = f"{where}.{name}"
        self._add(
            ("item", id(namespace), name),
            item_root(namespace, name, show, self._desc(m, "attr", name)),
        )
        cls = type(m)
        if name not in namespace and ("typeattr", id(cls), name) not in self.roots:
            desc = self._desc(m, "classattr", name)
            self._add(("typeattr", id(cls), name), typeattr_root(cls, name, show, desc))

    def table_read(self, m: nn.Module, name: str) -> None:
        """A parameter, buffer or submodule slot read as None."""
        if (id(m), name) in self._reads:
            return
        self._reads.add((id(m), name))
        self._alive.append(m)
        namespace = object.__getattribute__(m, "__dict__")
        for table in ("_parameters", "_buffers", "_modules"):
            slots = namespace.get(table)
            if isinstance(slots, dict) and name in slots:
                show = f"{self._where(m)}.{name}"
                desc = self._desc(m, "table", table, name)
                self._add(("item", id(slots), name), item_root(slots, name, show, desc))
                return

    def _frame(self, frame: types.FrameType) -> None:
        code = frame.f_code
        self._codes.add(id(code))
        self._alive.append(code)
        g = frame.f_globals
        module = str(g.get("__name__", ""))
        if is_pinned(module) or code.co_name == "<module>" or "__name__" not in g:
            return
        if generated_for(frame, module, code.co_qualname) is not None:
            return  # NOTE: a namedtuple's or dataclass's generated method: its class's
        if code.co_qualname.rsplit(".", 1)[-1] in _INLINE:
            return  # NOTE: a comprehension: its enclosing function's loads cover it
        if _under_import(frame):
            return  # NOTE: the import system's business (a finder), not the program's
        names = _attr_names(code)
        self.names |= names
        loads = _global_loads(code)
        for name in loads:
            self._global(g, module, name, frame.f_builtins)
        if _WHOLE_NAMESPACE & set(loads):
            for name in list(g):
                self._global(g, module, name, frame.f_builtins)
        fns = self._functions(frame)
        if fns is None:
            self.refusal = self.refusal or (
                f"the program runs {module}.{code.co_qualname}, whose function object plait "
                "cannot find to guard its closure and defaults"
            )
            return
        for fn in fns:
            where = f"{module}.{code.co_qualname}"
            found = find_function(module, code.co_qualname) is fn
            desc = ["func", module, code.co_qualname] if found else None
            if fn is not self.program:
                self._add(("func", id(fn)), func_root(fn, f"{where} (code, defaults)", desc))
            for k, (var, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
                root = cell_root(cell, f"{where}: closure variable {var}")
                root.desc = ["cell", module, code.co_qualname, k] if found else None
                self._add(("cell", id(cell)), root)

    def _global(self, g: dict, module: str, name: str, builtins_: dict) -> None:
        resolvable = sys.modules.get(module) is not None and vars(sys.modules[module]) is g
        desc = ["global", module, name] if resolvable else None
        show = f"global {module}.{name}"
        self._add(("item", id(g), name), item_root(g, name, show, desc))
        if name not in g:
            show = f"builtin {name}"
            self._add(
                ("item", id(builtins_), name), item_root(builtins_, name, show, ["builtin", name])
            )

    def _functions(self, frame: types.FrameType) -> list[types.FunctionType] | None:
        """The function objects running ``frame``'s code: by name, else by reference (a
        nested function or lambda: those whose cells hold what the frame sees)."""
        code = frame.f_code
        module = str(frame.f_globals.get("__name__", ""))
        fn = find_function(module, code.co_qualname)
        if fn is not None and fn.__code__ is code:
            return [fn]
        found = [
            f
            for f in gc.get_referrers(code)
            if isinstance(f, types.FunctionType) and f.__code__ is code
        ]
        if code.co_freevars:
            here = frame.f_locals
            found = [
                f
                for f in found
                if all(
                    here.get(var, ABSENT) is _cell_value(c)
                    for var, c in zip(code.co_freevars, f.__closure__ or ())
                )
            ]
        return found or None

    # -- after the capture
    def finish(self) -> list[Root]:
        """The roots, with those the recorded names reach in user objects and modules; raises
        :class:`GraphCaptureError` for a read that cannot be guarded."""
        if self.refusal is None:
            self._named_attributes()
        if self.refusal is not None:
            raise GraphCaptureError("Python state", self.refusal, kind="limitation")
        changed = [
            r.show
            for r in self.roots.values()
            if _Walk().key(r.read(), shallow=r.shallow) != r.first
        ]
        if changed:
            raise GraphCaptureError(
                "Python state",
                "the program changes Python values it reads while it runs "
                f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}); a compiled "
                "program would not replay that",
                kind="limitation",
            )
        return list(self.roots.values())

    def _named_attributes(self) -> None:
        """Attributes the code names of Python modules, classes and user objects its values
        reach (``cfg.SCALE``, ``Consts.EPS``, ``self.config.n_embd``)."""
        done: set[int] = set()
        pending = list(self.roots.values())
        while pending:
            walk = _Walk()
            base: dict[int, list[Any] | None] = {}
            for r in pending:
                value = r.read()
                base.setdefault(id(value), r.desc)  # NOTE: a host read directly: its path
                walk.key(value, shallow=r.shallow)
            before = len(self.roots)
            for host in walk.hosts:
                if id(host) in done:
                    continue
                done.add(id(host))
                self._alive.append(host)
                self._host(host, base.get(id(host)))
            pending = list(self.roots.values())[before:]

    def _host(self, host: Any, base: list[Any] | None) -> None:
        if isinstance(host, types.ModuleType):
            namespace = vars(host)
            loaded = sys.modules.get(host.__name__) is host
            for name in sorted(self.names & namespace.keys()):
                show = f"{host.__name__}.{name}"
                desc = (
                    ["global", host.__name__, name]
                    if loaded
                    else ["attrpath", base, name]
                    if base is not None
                    else None
                )
                root = item_root(namespace, name, show, desc)
                root.shallow = is_pinned(host.__name__)
                self._add(("item", id(namespace), name), root)
            return
        cls = host if isinstance(host, type) else type(host)
        own = getattr(host, "__dict__", {}) if not isinstance(host, type) else {}
        if not _is_value_object(host, cls):
            return
        for name in sorted(self.names):
            if name in own or _mro_lookup(cls, name) is ABSENT:
                continue
            show = f"{cls.__qualname__}.{name}"
            found: list[Any] | None = ["typeattr", cls.__module__, cls.__qualname__, name]
            if "<" in cls.__qualname__ or find_class(cls.__module__, cls.__qualname__) is not cls:
                found = ["attrpath", base, name] if base is not None else None
            self._add(("typeattr", id(cls), name), typeattr_root(cls, name, show, found))


_INLINE = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")
_IMPORT_SYSTEM = frozenset(
    {
        "_frozen_importlib",
        "_frozen_importlib_external",
        "importlib._bootstrap",
        "importlib._bootstrap_external",
    }
)


def _under_import(frame: types.FrameType) -> bool:
    caller = frame.f_back
    while caller is not None:
        if caller.f_globals.get("__name__") in _IMPORT_SYSTEM:
            return True
        caller = caller.f_back
    return False


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return ABSENT


# --- the guard --------------------------------------------------------------------------------
def resolve(desc: list[Any], module: nn.Module | None) -> Root:
    """The root ``desc`` describes in this process (a warm start); raises ``LookupError``."""
    kind = desc[0]
    if kind in ("attr", "classattr", "type", "dict", "table"):
        if module is None:
            raise LookupError("a module attribute without a module")
        m = module.get_submodule(desc[1]) if desc[1] else module
        where = f"self.{desc[1]}" if desc[1] else "self"
        if kind == "dict":
            return dict_root(m, where, desc)
        if kind == "type":
            return type_root(m, f"type({where})", desc)
        if kind == "attr":
            namespace = object.__getattribute__(m, "__dict__")
            return item_root(namespace, desc[2], f"{where}.{desc[2]}", desc)
        if kind == "table":
            slots = object.__getattribute__(m, "__dict__")[desc[2]]
            return item_root(slots, desc[3], f"{where}.{desc[3]}", desc)
        return typeattr_root(type(m), desc[2], f"{where}.{desc[2]}", desc)
    if kind == "global":
        mod = sys.modules.get(desc[1])
        if mod is None:
            raise LookupError(f"module {desc[1]} is not loaded")
        root = item_root(vars(mod), desc[2], f"global {desc[1]}.{desc[2]}", desc)
        root.shallow = is_pinned(desc[1])
        return root
    if kind == "builtin":
        return item_root(vars(builtins), desc[1], f"builtin {desc[1]}", desc)
    if kind == "func":
        fn = find_function(desc[1], desc[2])
        if fn is None:
            raise LookupError(f"{desc[1]}.{desc[2]} is not loaded")
        return func_root(fn, f"{desc[1]}.{desc[2]} (code, defaults)", desc)
    if kind == "cell":
        fn = find_function(desc[1], desc[2])
        if fn is None or fn.__closure__ is None or len(fn.__closure__) <= desc[3]:
            raise LookupError(f"{desc[1]}.{desc[2]} has not that closure")
        name = fn.__code__.co_freevars[desc[3]]
        root = cell_root(fn.__closure__[desc[3]], f"{desc[1]}.{desc[2]}: closure variable {name}")
        root.desc = desc
        return root
    if kind == "attrpath":
        base = resolve(desc[1], module).read()
        if isinstance(base, types.ModuleType):
            root = item_root(vars(base), desc[2], f"{base.__name__}.{desc[2]}", desc)
            root.shallow = is_pinned(base.__name__)
            return root
        cls = base if isinstance(base, type) else type(base)
        return typeattr_root(cls, desc[2], f"{cls.__qualname__}.{desc[2]}", desc)
    if kind == "typeattr":
        cls = find_class(desc[1], desc[2])
        if not isinstance(cls, type):
            raise LookupError(f"{desc[1]}.{desc[2]} is not loaded")
        return typeattr_root(cls, desc[3], f"{desc[2]}.{desc[3]}", desc)
    raise LookupError(f"unknown Python read {kind!r}")


def _plain(key: Any) -> bool:
    """A value key of a plain value: ``(type, value)`` or ``(type, "bits", ...)``."""
    return (
        isinstance(key, tuple)
        and len(key) >= 2
        and isinstance(key[0], type)
        and (key[1] == "bits" or not isinstance(key[1], tuple))
    )


def _difference(a: Any, b: Any, where: str) -> tuple[str, Any, Any]:
    """The first place two value keys differ (``self.config.n_embd``) and the two values."""
    while (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b)
        and not _plain(a)
        and not _plain(b)
    ):
        i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
        x, y = a[i], b[i]
        if (
            isinstance(x, tuple)
            and isinstance(y, tuple)
            and len(x) == len(y) == 2
            and x[0] == y[0]
            and not _plain(x)
        ):
            name = x[0]
            if isinstance(name, str):
                where += f".{name}"
            elif _plain(name):
                where += f"[{name[1]!r}]"
            a, b = x[1], y[1]
            continue
        a, b = x, y
    return where, a, b


def _short(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 3 and key[1] == "bits":
        return repr(struct.unpack("<d", struct.pack("<q", key[2]))[0])
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], type):
        text = repr(key[1])
    else:
        text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def python_values_guard(roots: Sequence[Root]) -> Guard | None:
    """One guard over ``roots``: holds while each root's value key is the one it has now."""
    if not roots:
        return None
    walk = _Walk()
    keys = []
    heads = []
    for r in roots:
        value = r.read()
        keys.append(walk.key(value, shallow=r.shallow))
        heads.append(r.native(value))
    expected = tuple(keys)
    shallow = [r.shallow for r in roots]
    readers = [r.read for r in roots]

    def read(env: GuardEnv) -> Any:
        w = _Walk()
        return tuple(w.key(f(), shallow=s) for f, s in zip(readers, shallow))

    def detail(env: GuardEnv) -> str:
        now = read(env)
        changed = []
        for r, a, b in zip(roots, expected, now):
            if a != b:
                where, was, got = _difference(a, b, r.show)
                changed.append(f"{where}: was {_short(was)}, now {_short(got)}")
        return "; ".join(changed[:3]) + (" ..." if len(changed) > 3 else "")

    descs = [r.desc for r in roots]
    key = "python|" + repr(sorted(repr(d) for d in descs))
    return Guard(
        "python",
        "Python values read",
        f"the Python values the program read ({len(roots)}) are unchanged",
        expected,
        read,
        detail,
        fmt=lambda r: "as captured" if r is expected else "a change",
        key=key,
        native=ReadPyValues(_grouped(heads + walk.checks), ABSENT),
    )


def _grouped(checks: list[tuple[Any, ...]]) -> tuple[tuple[Any, ...], ...]:
    """One check per mapping (per class) for the items read of it: one version load covers
    them all; duplicates (a container reached twice) once."""
    out: list[Any] = []
    merged: dict[tuple[int, int], tuple[list[Any], list[Any]]] = {}
    seen: set[tuple[Any, ...]] = set()
    for c in checks:
        if c[0] in (ITEMS, TYPEATTRS):
            slot = merged.get((c[0], id(c[1])))
            if slot is None:
                slot = merged[(c[0], id(c[1]))] = ([], [])
                out.append((c[0], c[1], slot))
            slot[0].extend(c[2])
            slot[1].extend(c[3])
            continue
        ident = (c[0], *(id(x) for x in c[1:2]))
        if c[0] != PYTHON and ident in seen:
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
            raise ValueError(f"the program reads {r.show}, which has no saved form")
        out.append(r.desc)
    return out

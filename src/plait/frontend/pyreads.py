"""The Python values a capture reads, recorded while it runs and guarded after it.

A captured graph bakes in what the program read of Python state: ``self.alpha`` becomes a literal,
``if CONFIG.use_bias:`` picks a branch. :class:`PyReads` records those reads during the trace:

- attribute reads on every ``nn.Module`` (``nn.Module.__getattribute__`` is instrumented while a
  capture runs, so the reads PyTorch's own ``forward`` makes, ``self.stride``, count too): the
  instance's value, or the class attribute it finds (methods, class constants, properties);
- for each function of user code that runs (a global trace function that sees each new frame,
  or a profile hook chained to the one in place where a tracer is active): the globals its code
  loads (and the builtins it falls back to), the attributes it names of global modules and
  classes, its closure cells, its defaults and its code object;
- parameter, buffer and submodule slots read as ``None`` (``nn.Module.__getattr__``);
- the attributes that code names of any user object reached from those values (a config
  object's class constants).

Each read is a *root* (where it was read, so it can be read again: :mod:`plait.frontend.pyvalues`
has the roots, the value keys they are compared by and the guard over them): plain values by
value (floats by their IEEE-754 bits), containers and user objects (dataclasses,
``SimpleNamespace``, Hugging Face ``PretrainedConfig`` ...) by their contents recursively,
tensors, modules, functions, classes and library objects by identity. The guard holds while
every root's value key is the one capture saw; its native form checks identities and CPython's
dict version tags (a few nanoseconds per dict), and asks the Python read only after something
was assigned.

A read that cannot be attributed is never ignored: a module class with its own
``__getattribute__`` (or a program that reads ``__dict__``) has its whole instance dict guarded;
code that calls ``globals()``, ``eval`` or ``exec`` has its whole module namespace guarded (its
import metadata by identity: :mod:`plait.frontend.namespace_reads`); a
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

import gc
import importlib.util
import sys
import types
from typing import Any

from torch import nn

from plait.errors import GraphCaptureError
from plait.frontend import library_reads
from plait.frontend.attr_reads import _LOCAL, _instrument
from plait.frontend.bound_state import bound_roots
from plait.frontend.capture_values import Tracer
from plait.frontend.code_origin import find_function, generated_for, is_pinned, under_import
from plait.frontend.library_reads import FRAME_READS, cache_entries_root, module_property_roots
from plait.frontend.mutable_library_values import CACHED, warn_of_clocks
from plait.frontend.namespace_reads import (
    WHOLE_NAMESPACE,
    attr_names,
    global_loads,
    imported_names,
    name_roots,
    whole_names_root,
)
from plait.frontend.process_reads import ENV_NAMES, GlobalDraws
from plait.frontend.pyrollback import Originals, holds_tracer
from plait.frontend.pyvalues import (
    _MODULE_SKIP,
    ABSENT,
    Keyed,
    Root,
    Same,
    _cell_value,
    _is_user_class,
    _is_value_object,
    _mro_lookup,
    _Walk,
    cell_root,
    dict_root,
    environ_root,
    find_class,
    func_root,
    item_root,
    keyed,
    namespace_root,
    quick_key,
    table_names_root,
    type_root,
    typeattr_root,
)

# --- recording -----------------------------------------------------------------------------
_TABLES = ("_parameters", "_buffers", "_modules")
_STATE_TABLES = ("_parameters", "_buffers")


class PyReads:
    """Records the Python values a capture reads (see the module doc); ``module`` is the
    compiled module (its submodules' paths name their roots), if any."""

    def __init__(self, module: nn.Module | None = None, program: Any = None) -> None:
        # NOTE: its defaults bind the call's arguments (guarded there); read: closure, bound state
        self.program = program
        self.paths: dict[int, str] = {}
        self.tree: list[nn.Module] = []
        if module is not None:
            for path, m in module.named_modules(remove_duplicate=False):
                self.paths.setdefault(id(m), path)
                self.tree.append(m)
        # NOTE: each a Root, or a module attribute read (module_read) until finish() makes it one
        self.roots: dict[tuple[Any, ...], Any] = {}
        self.names: set[str] = set()
        self.refusal: str | None = None
        self.keys: list[Keyed] = []  # NOTE: set by finish()
        self._reads: set[tuple[int, str]] = set()
        self._slots: set[tuple[int, str]] = set()  # NOTE: table_read's
        # NOTE: roots keyed at finish, not when read: the tables, flags and missing names of
        # modules outside the compiled module, which a module the program builds while it
        # runs (a cache's ModuleList) fills in then
        self._late: set[tuple[Any, ...]] = set()
        # NOTE: each attribute read of a module outside the compiled module (that found no tracer)
        self._outside: list[tuple[dict, str, str]] = []
        self._codes: set[int] = set()
        # NOTE: (name, level, package) of each module user code imports as it runs (``from m
        # import SCALE`` inside forward): hosts of the names the code uses, as global modules
        self._imports: list[tuple[str, int, str | None]] = []
        self.user_codes: list[types.CodeType] = []  # NOTE: the program's own, in order run
        # NOTE: codes with free variables: each frame of one is matched to its function object
        # (several functions share a code, each with its own closure cells, all guarded)
        self._with_cells: set[int] = set()
        # NOTE: (frame, module, its closure values' keys) of frames whose function is found
        # after they finish (_frame); the frames are kept alive until then
        self._pending: list[tuple[types.FrameType, str, list[Any]]] = []
        self._alive: list[Any] = []
        self._previous: Any = None
        self._trace: Any = None
        self.originals = Originals()  # NOTE: put back where the program changes what it read
        self._active = False
        self._tracing = False
        self._gc_was_enabled = False
        self._bypass = False  # NOTE: see _around
        self._draws = GlobalDraws()  # NOTE: Python's and NumPy's generators, as they are now

    # -- entering and leaving
    def __enter__(self) -> PyReads:
        for key, root in bound_roots(self.program):
            self._add(key, root)  # NOTE: obj.step's obj, a partial's arguments, a callable obj
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

        codes, with_cells = self._codes, self._with_cells

        def trace(frame: types.FrameType, event: str, arg: Any) -> None:
            if event == "call" and (
                id(frame.f_code) not in codes or id(frame.f_code) in with_cells
            ):
                self._safely(self._frame, frame)

        def hook(frame: types.FrameType, event: str, arg: Any) -> None:
            if previous is not None:
                previous(frame, event, arg)
            if event == "call" and (
                id(frame.f_code) not in codes or id(frame.f_code) in with_cells
            ):
                self._safely(self._frame, frame)

        # NOTE: no cyclic collection while recording: what it runs (gc callbacks, __del__ of
        # unrelated garbage) is not the program's code (as for plait.snapshots.deps)
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        _LOCAL.rec = self
        if self._tracing:
            self._trace = trace
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

    def pause(self) -> bool:
        """Stop seeing new frames until :meth:`resume` (True if it stopped). For plait's own
        code only: a trace function in place makes CPython 3.11 run every frame unspecialized,
        with a line check per instruction (about a third of a capture's time). NOTE: the caller
        guarantees no frame of the program's code starts while paused."""
        if not self._active or not self._tracing or sys.gettrace() is not self._trace:
            return False
        sys.settrace(None)
        return True

    def resume(self) -> None:
        if self._active:
            sys.settrace(self._trace)

    def _safely(self, record: Any, *args: Any) -> None:
        """NOTE: an exception must never leave a trace hook or an attribute read: it would
        surface in user code; a read that could not be recorded refuses the capture."""
        try:
            record(*args)
        except Exception as exc:
            self.refusal = self.refusal or f"recording a Python read failed ({exc!r})"

    # -- what is read
    def _where(self, m: Any) -> str:
        path = self.paths.get(id(m))
        if path is None:
            return f"a {type(m).__name__} module outside the compiled module"
        return f"self.{path}" if path else "self"

    def _desc(self, m: Any, kind: str, *rest: Any) -> list[Any] | None:
        path = self.paths.get(id(m))
        return None if path is None else [kind, path, *rest]

    def _add(self, key: tuple[Any, ...], root: Root, late: bool = False) -> None:
        """``late``: the root is keyed at :meth:`finish` (see ``_late``), not now."""
        if key in self.roots:
            return
        if late:
            self._late.add(key)
            self.roots[key] = root
            return
        try:
            root.first = keyed(root).key
        except GraphCaptureError as exc:
            self.refusal = self.refusal or exc.reason
            return
        self.roots[key] = root

    def module_read(self, m: nn.Module, name: str) -> None:
        """NOTE: runs on each module attribute the program reads first: it keys the values
        read now (a change before the capture ends is refused), and leaves the roots' making
        (names, descriptions) to :meth:`finish` (:meth:`_made`)."""
        if (id(m), name) in self._reads or (
            name in _MODULE_SKIP
            and (name == "__class__" or (name not in _TABLES and id(m) in self.paths))
        ):
            return  # NOTE: the state guards cover the flags of the compiled module
        self._reads.add((id(m), name))
        self._alive.append(m)
        namespace = object.__getattribute__(m, "__dict__")
        if name == "__dict__":
            self._add(("dict", id(m)), dict_root(m, self._where(m), self._desc(m, "dict")))
            return
        if name in _STATE_TABLES and id(m) in self.paths:
            # NOTE: its tensors are the module state (swapped for tracers while the capture
            # runs, read each call): the names it holds are what the program read of it
            show, desc = f"{self._where(m)}.{name}", self._desc(m, "tablenames", name)
            self._add(("tablenames", id(m), name), table_names_root(m, name, show, desc))
            return
        roots = self.roots
        cls = type(m)
        # NOTE: a module outside the compiled module is named by its class now, as read
        outside = None if id(m) in self.paths else self._where(m)
        key: tuple[Any, ...] = ("type", id(m))
        if key not in roots:
            roots[key] = ("type", m, m, name, outside, Same(cls))  # NOTE: _Walk's class key
        found = namespace.get(name, ABSENT)
        self.originals.note(namespace, name, found)
        late = outside is not None and (name in _MODULE_SKIP or found is ABSENT)
        if outside is not None and not isinstance(found, Tracer):
            self._outside.append((namespace, name, f"{outside}.{name}"))
        key = ("item", id(namespace), name)
        if key not in roots:
            self._pend(key, ("attr", m, namespace, name, outside), found, False, late)
        key = ("typeattr", id(cls), name)
        if found is ABSENT and key not in roots:
            read = ("classattr", m, cls, name, outside)
            self._pend(key, read, _mro_lookup(cls, name), not _is_user_class(cls), late)

    def _pend(
        self, key: tuple[Any, ...], read: tuple[Any, ...], value: Any, shallow: bool, late: bool
    ) -> None:
        """A root made at :meth:`finish`, keyed by the value read now (as :meth:`_add`)."""
        if late:
            self._late.add(key)
            self.roots[key] = (*read, None)
            return
        try:
            self.roots[key] = (*read, quick_key(value, shallow))
        except GraphCaptureError as exc:
            self.refusal = self.refusal or exc.reason

    def _made(
        self, kind: str, m: nn.Module, obj: Any, name: str, outside: str | None, first: Any
    ) -> Root:
        """The root of a module attribute read that :meth:`module_read` recorded."""
        path = self.paths.get(id(m))  # NOTE: _where and _desc, inline
        if path is None:
            assert outside is not None
            where = outside
        else:
            where = f"self.{path}" if path else "self"
        if kind == "type":
            root = type_root(m, f"type({where})", None if path is None else ["type", path])
        elif kind == "attr":
            desc = None if path is None else ["attr", path, name]
            root = item_root(obj, name, f"{where}.{name}", desc)
        else:
            desc = None if path is None else ["classattr", path, name]
            root = typeattr_root(obj, name, f"{where}.{name}", desc)
        root.first = first
        return root

    def table_read(self, m: nn.Module, name: str, absent: bool = False) -> None:
        """A parameter, buffer or submodule slot read: one holding None, any one of a module
        outside the compiled module (the state guards cover the compiled module's), or
        (``absent``) a name no slot holds (``hasattr``, ``getattr`` with a default), which the
        instance and its class lack too."""
        if absent:
            self.module_read(m, name)
        if (id(m), name) in self._slots:
            return
        self._slots.add((id(m), name))
        self._alive.append(m)
        late = id(m) not in self.paths
        namespace = object.__getattribute__(m, "__dict__")
        for table in ("_parameters", "_buffers", "_modules"):
            slots = namespace.get(table)
            if isinstance(slots, dict) and (absent or name in slots):
                show, desc = f"{self._where(m)}.{name}", self._desc(m, "table", table, name)
                self._add(("item", id(slots), name), item_root(slots, name, show, desc), late)
                if not absent:
                    return

    def _frame(self, frame: types.FrameType) -> None:
        code = frame.f_code
        library = FRAME_READS.get(code)
        if library is not None:  # NOTE: each frame of it (never in _codes): what it reads
            for key, root in library(frame):
                self._add(key, root)
            return
        g = frame.f_globals
        module = str(g.get("__name__", ""))
        if id(code) not in self._codes:
            self._codes.add(id(code))
            self._alive.append(code)
            if is_pinned(module) or code.co_name == "<module>" or "__name__" not in g:
                return
            if generated_for(frame, module, code.co_qualname) is not None:
                return  # NOTE: a namedtuple's or dataclass's generated method: its class's
            if code.co_qualname.rsplit(".", 1)[-1] in _INLINE:
                return  # NOTE: a comprehension: its enclosing function's loads cover it
            if under_import(frame):
                return  # NOTE: the import system's business (a finder), not the program's
            self.user_codes.append(code)
            names = attr_names(code)
            self.names |= names
            loads = global_loads(code)
            if ENV_NAMES & (names | set(loads)):
                self._add(("environ",), environ_root())
            for name in loads:
                self._global(g, module, name, frame.f_builtins)
            for name, level in imported_names(code):
                self._imports.append((name, level, g.get("__package__")))
            if "__getattribute__" in names and "object" in loads:
                self._around()  # NOTE: object.__getattribute__(self, "scale")
            if WHOLE_NAMESPACE & set(loads):
                for name in list(g):
                    self._global(g, module, name, frame.f_builtins)
                self._add(*whole_names_root(g, module, self._resolvable(g, module)))
            if code.co_freevars:
                self._with_cells.add(id(code))
        fn = find_function(module, code.co_qualname)
        if fn is not None and fn.__code__ is code:
            # NOTE: found by name (a method with a __class__ cell): one function, its frames
            # need no second look
            self._with_cells.discard(id(code))
            self._record(fn, code, module, None, by_name=True)
            return
        # NOTE: a nested function or lambda (several may share this code, each with its own
        # cells): which one runs this frame is known exactly once the frame has finished (a
        # finished frame references its function); its closure values are keyed now, when read
        here = frame.f_locals if code.co_freevars else {}
        try:
            keys = [_Walk().key(here.get(var, ABSENT)) for var in code.co_freevars]
        except GraphCaptureError as exc:
            self.refusal = self.refusal or exc.reason
            return
        for var in code.co_freevars:
            value = here.get(var, ABSENT)
            if value is not ABSENT:
                self.originals.note_closure(value)
        self._pending.append((frame, module, keys))

    def _record(
        self,
        fn: types.FunctionType,
        code: types.CodeType,
        module: str,
        keys: list[Any] | None,
        by_name: bool = False,
    ) -> None:
        """Roots for ``fn``'s code, defaults and closure cells; ``keys``: the cells' value
        keys when the frame read them (None: read now); ``by_name``: ``fn`` is found again by
        its module and qualified name (another process can find its roots)."""
        where = f"{module}.{code.co_qualname}"
        found = by_name
        desc = ["func", module, code.co_qualname] if found else None
        if fn is not self.program:
            self._add(("func", id(fn)), func_root(fn, f"{where} (code, defaults)", desc))
        for k, (var, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
            root = cell_root(cell, f"{where}: closure variable {var}")
            root.desc = ["cell", module, code.co_qualname, k] if found else None
            if keys is None or ("cell", id(cell)) in self.roots:
                self._add(("cell", id(cell)), root)
            else:
                root.first = keys[k]
                self.roots[("cell", id(cell))] = root

    def _resolve_pending(self) -> None:
        """The function objects of the frames recorded while they ran (see ``_frame``)."""
        pending, self._pending = self._pending, []
        for frame, module, keys in pending:
            code = frame.f_code
            fns = [
                r
                for r in gc.get_referents(frame)
                if type(r) is types.FunctionType and r.__code__ is code
            ]
            if not fns:  # NOTE: a frame still suspended (a generator's): by reference
                here = dict(zip(code.co_freevars, keys))
                fns = [
                    f
                    for f in gc.get_referrers(code)
                    if isinstance(f, types.FunctionType)
                    and f.__code__ is code
                    and all(
                        _Walk().key(_cell_value(c)) == here[var]
                        for var, c in zip(code.co_freevars, f.__closure__ or ())
                    )
                ]
            if not fns:
                self.refusal = self.refusal or (
                    f"the program runs {module}.{code.co_qualname}, whose function object "
                    "plait cannot find to guard its closure and defaults"
                )
                continue
            for fn in fns:
                self._record(fn, code, module, keys)

    def _around(self) -> None:
        """The program may read module attributes around the instrument (its code names
        ``object.__getattribute__``): the instance dicts of the compiled module's modules are
        guarded whole now, those of the other modules it read at :meth:`finish`."""
        if self._bypass:
            return
        self._bypass = True
        for m in self.tree:
            self._add(("dict", id(m)), dict_root(m, self._where(m), self._desc(m, "dict")))

    def _global(self, g: dict, module: str, name: str, builtins_: dict) -> None:
        if g.get(name) is _OBJECT_GETATTRIBUTE:
            self._around()  # NOTE: an alias of object.__getattribute__
        desc = ["global", module, name] if self._resolvable(g, module) else None
        self.originals.note(g, name, g.get(name, ABSENT))
        for key, root in name_roots(g, name, f"global {module}.{name}", desc):
            self._add(key, root)
        if name not in g:
            show = f"builtin {name}"
            root = namespace_root(builtins_, name, show, ["builtin", name])
            self._add(("item", id(builtins_), name), root)

    @staticmethod
    def _resolvable(g: dict, module: str) -> bool:
        return sys.modules.get(module) is not None and vars(sys.modules[module]) is g

    # -- after the capture
    def finish(self, inputs: Any = ()) -> list[Root]:
        """The roots, with those the recorded names reach in user objects and modules, and in
        the classes of the call's ``inputs`` (its opened objects: ``cache.SCALE`` a class
        constant); raises :class:`GraphCaptureError` for a read that cannot be guarded.
        ``self.keys`` then holds each root read now (:func:`~plait.frontend.pyvalues.keyed`),
        in the same order."""
        self._resolve_pending()
        for x in inputs:
            self._alive.append(x)
            self._host(x, None)
        for mod in _imported_modules(self._imports):
            self._alive.append(mod)
            self._host(mod, None)
        if self._bypass:
            for m in [m for m in self._alive if isinstance(m, nn.Module)]:
                self._add(("dict", id(m)), dict_root(m, self._where(m), self._desc(m, "dict")))
        made = self.roots
        for key, r in made.items():
            if type(r) is tuple:
                made[key] = self._made(*r)
        keys: dict[int, Keyed] = {}
        self.refusal = self.refusal or self._draws.refusal()
        if self.refusal is None:
            self._named_attributes(keys)
        if self.refusal is not None:
            raise GraphCaptureError("Python state", self.refusal, kind="limitation")
        roots: list[Root] = list(self.roots.values())
        for r in roots:
            if id(r) not in keys:
                keys[id(r)] = keyed(r)
        # NOTE: a module outside the compiled one that the program set to one of its tensors
        # (self.scale = t where it read None, or nothing: a late root, keyed after the run, would
        # be guarded as that tensor) is refused, and put back as read by the originals' restore
        # below (plait.frontend.state puts back the compiled module's) for the run that follows
        stored = {show for ns, n, show in self._outside if _holds_tracer(ns, n)}
        changed = sorted(stored) + [
            r.show for k, r in zip(self.roots, roots)
            if k not in self._late and keys[id(r)].key != r.first and r.show not in stored
        ]  # fmt: skip
        if changed:
            raise self.originals.refused(changed, self.user_codes)
        self.keys = [keys[id(r)] for r in roots]
        warn_of_clocks((r.show, keys[id(r)].value) for r in roots)
        return roots

    def _named_attributes(self, keys: dict[int, Keyed]) -> None:
        """Attributes the code names of Python modules, classes and user objects its values
        reach (``cfg.SCALE``, ``Consts.EPS``, ``self.config.n_embd``); ``keys`` gets each root
        read now."""
        done: set[int] = set()
        pending = list(self.roots.values())
        while pending:
            base: dict[int, list[Any] | None] = {}
            hosts: list[Any] = []
            for r in pending:
                k = keys[id(r)] = keyed(r)
                base.setdefault(id(k.value), r.desc)  # NOTE: a host read directly: its path
                hosts.extend(k.hosts)
            before = len(self.roots)
            for host in hosts:
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
                for key, root in name_roots(namespace, name, show, desc, is_pinned(host.__name__)):
                    self._add(key, root)
            for key, root in module_property_roots(host, self.names):
                self._add(key, root)
            return
        if type(host) is CACHED:  # NOTE: a functools cache: the results it holds now
            show = getattr(host, "__qualname__", "a function")
            stored = library_reads.drop_capture_entries(host, show, holds_tracer)
            if stored is not None:  # NOTE: the eager run fills it (not this call's graph)
                self.refusal, self.originals.put_back = self.refusal or stored, True
                return
            entries = cache_entries_root(host, show)
            if entries is not None:
                self._add(("cache", id(host)), entries)
            return
        cls = host if isinstance(host, type) else type(host)
        own = getattr(host, "__dict__", {}) if not isinstance(host, type) else {}
        if not _is_value_object(host, cls):
            return
        # NOTE: the names _mro_lookup finds on cls (a class namespace never holds ABSENT)
        defined = set().union(*(vars(c).keys() for c in cls.__mro__))
        by_name: bool | None = None
        for name in sorted(self.names & defined):
            if name in own:
                continue
            if by_name is None:
                by_name = "<" not in cls.__qualname__ and (
                    find_class(cls.__module__, cls.__qualname__) is cls
                )
            show = f"{cls.__qualname__}.{name}"
            found: list[Any] | None = ["typeattr", cls.__module__, cls.__qualname__, name]
            if not by_name:
                found = ["attrpath", base, name] if base is not None else None
            self._add(("typeattr", id(cls), name), typeattr_root(cls, name, show, found))


_OBJECT_GETATTRIBUTE = object.__getattribute__
_INLINE = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


def _holds_tracer(namespace: dict, name: str) -> bool:
    return isinstance(namespace.get(name), Tracer)


def _imported_modules(imports: list[tuple[str, int, str | None]]) -> list[types.ModuleType]:
    """The loaded modules of ``imports`` ((name, level, importing package)), each package on
    the way too (``import a.b`` binds ``a``)."""
    out: dict[str, types.ModuleType] = {}
    for name, level, package in imports:
        try:
            full = importlib.util.resolve_name("." * level + name, package) if level else name
        except (ImportError, ValueError):
            continue
        parts = full.split(".")
        for k in range(1, len(parts) + 1):
            mod = sys.modules.get(".".join(parts[:k]))
            if isinstance(mod, types.ModuleType):
                out.setdefault(mod.__name__, mod)
    return list(out.values())

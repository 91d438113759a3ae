"""The instrument of ``nn.Module`` attribute reads that :class:`plait.frontend.pyreads.PyReads`
records: while a capture runs, ``nn.Module.__getattribute__`` and ``nn.Module.__getattr__`` are
replaced by recording ones, which hand each first read of a module attribute (and a parameter,
buffer or submodule slot read as None) to the recorder of the running thread (``_LOCAL.rec``).

NOTE: the recorder's own reads are not the program's: ``_LOCAL.rec`` is None while it records,
and it runs with frame tracing paused (:meth:`~plait.frontend.pyreads.PyReads.pause`).
"""

from __future__ import annotations

import sys
import threading
import types
from collections import OrderedDict
from typing import Any

from torch import nn

from plait.frontend.code_origin import is_pinned
from plait.frontend.pyvalues import _MODULE_SKIP

_LOCAL = threading.local()
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = [0]


def _recording_getattribute(self: Any, name: str) -> Any:
    try:
        value = object.__getattribute__(self, name)
    except AttributeError:
        # NOTE: nothing in the instance dict or the class: a __getattr__ of the module's own
        # may answer a default, which an attribute set later would shadow (PyTorch's own
        # __getattr__ records what it finds, or that it finds nothing)
        rec = getattr(_LOCAL, "rec", None)
        if rec is not None and type(self).__getattr__ is not _recording_getattr:
            _record(rec, rec.module_read, self, name)
        raise
    rec = getattr(_LOCAL, "rec", None)
    if (
        rec is None
        or (name in _MODULE_SKIP and (name == "__class__" or _guarded(rec, self, name)))
        or (id(self), name) in rec._reads
    ):
        return value  # NOTE: what module_read would skip, without its call
    if not (name == "__dict__" and _library_caller()):
        _LOCAL.rec = None  # NOTE: the recorder's own reads are not the program's
        paused = rec.pause()  # NOTE: nor its frames (and they run faster untraced)
        try:
            rec.module_read(self, name)
        except Exception as exc:  # NOTE: as _safely
            rec.refusal = rec.refusal or f"recording a Python read failed ({exc!r})"
        finally:
            _LOCAL.rec = rec
            if paused:
                rec.resume()
    return value


def _guarded(rec: Any, m: Any, name: str) -> bool:
    """Whether the state guards cover ``m.name`` (one of :data:`_MODULE_SKIP`): the flags of
    the compiled module's modules, but not what its tables hold, read as tables (an appended
    layer is not one of the captured edges, ``nn.Sequential`` iterates the table; a parameter
    registered later is not one of the captured entries, ``parameters()`` iterates the
    table)."""
    return name not in _TABLES and id(m) in rec.paths


def _record(rec: Any, record: Any, *args: Any) -> None:
    """``record(*args)`` as the recorder's own code: its reads and frames are not the
    program's."""
    _LOCAL.rec = None
    paused = rec.pause()
    try:
        rec._safely(record, *args)
    finally:
        _LOCAL.rec = rec
        if paused:
            rec.resume()


def _library_caller() -> bool:
    """Whether the attribute read comes from PyTorch's (or plait's) own code: their reads of
    ``__dict__`` (``nn.Module.__getattr__`` finding parameters) are not the program's."""
    frame = sys._getframe(2)
    return is_pinned(str(frame.f_globals.get("__name__", "")))


# NOTE: the __getattr__ in place when the instrument went in (restored when it comes out)
_MODULE_GETATTR = [nn.Module.__getattr__]


def _recording_getattr(self: Any, name: str) -> Any:
    """``nn.Module.__getattr__`` (parameters, buffers, submodules): a slot holding None is a
    Python value the program read (``if self.bias is not None``), and so is a name no slot
    holds (``hasattr``); a tensor or a submodule of the compiled module is guarded by the state
    guards, one of a module outside it (a global module a compiled function calls) here."""
    rec = getattr(_LOCAL, "rec", None)
    if rec is None:
        return _MODULE_GETATTR[0](self, name)
    paused = rec.pause()
    try:
        if _pinned_lookup(self, name):
            # NOTE: PyTorch's own lookup, in tables of built-in types, runs no code of the
            # program (its frames need not be seen) and reads nothing but the instance's
            # __dict__, a library read the program's reads never include
            _LOCAL.rec = None
            try:
                value = _MODULE_GETATTR[0](self, name)
            finally:
                _LOCAL.rec = rec
        else:
            if paused:
                paused = False
                rec.resume()
            value = _MODULE_GETATTR[0](self, name)
    except AttributeError:
        _record(rec, rec.table_read, self, name, True)  # NOTE: hasattr, getattr with a default
        raise
    finally:
        if paused:
            rec.resume()
    if value is None or id(self) not in rec.paths:
        _record(rec, rec.table_read, self, name)
    return value


# NOTE: whether the __getattr__ in place is PyTorch's own (as imported), which reads nothing
# of the module but its __dict__
_TORCH_GETATTR = nn.Module.__getattr__
_GETATTR_PINNED = [False]
_TABLES = ("_parameters", "_buffers", "_modules")
_TABLE_TYPES = frozenset({dict, OrderedDict, type(None)})


def _pinned_lookup(m: Any, name: Any) -> bool:
    """Whether ``nn.Module.__getattr__`` on ``m`` runs PyTorch's and plait's code alone: the
    lookup is PyTorch's, the instance's ``__dict__`` is read through the instrumented
    ``__getattribute__``, and the tables and the name are of exact built-in types."""
    if not _GETATTR_PINNED[0] or type(name) is not str:
        return False
    if type(m).__getattribute__ is not _recording_getattribute:
        return False
    namespace = object.__getattribute__(m, "__dict__")
    return all(type(namespace.get(t)) in _TABLE_TYPES for t in _TABLES)


def _instrument(on: bool) -> None:
    with _PATCH_LOCK:
        _PATCH_USERS[0] += 1 if on else -1
        if on and _PATCH_USERS[0] == 1:
            _MODULES_BEFORE[0] = sys.modules.copy()
            _MODULE_GETATTR[0] = nn.Module.__getattr__
            found = _MODULE_GETATTR[0]
            _GETATTR_PINNED[0] = (
                found is _TORCH_GETATTR
                and isinstance(found, types.FunctionType)
                and found.__globals__.get("__name__") == "torch.nn.modules.module"
            )
            nn.Module.__getattribute__ = _recording_getattribute  # type: ignore[method-assign]
            nn.Module.__getattr__ = _recording_getattr  # type: ignore[method-assign]
        elif not on and _PATCH_USERS[0] == 0:
            del nn.Module.__getattribute__
            nn.Module.__getattr__ = _MODULE_GETATTR[0]  # type: ignore[method-assign]
            _repair_copies()


# NOTE: modules imported while the instrument is in (a type rule's fake tensors import Dynamo,
# which keeps nn.Module.__getattr__ in module globals as imported: with the recording one for
# good, Dynamo takes parameters for inputs) get the original back when it comes out.
_MODULES_BEFORE: list[dict[str, Any]] = [{}]


def _repair_copies() -> None:
    if len(sys.modules) == len(_MODULES_BEFORE[0]):
        return
    before = _MODULES_BEFORE[0]
    for name in [name for name in list(sys.modules) if name not in before]:
        found = getattr(sys.modules.get(name), "__dict__", None)
        if not isinstance(found, dict):
            continue
        for key, value in list(found.items()):
            if value is _recording_getattr:
                found[key] = _MODULE_GETATTR[0]
            elif value is _recording_getattribute:
                found[key] = object.__getattribute__

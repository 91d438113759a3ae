"""The C entries of plait's native kernels (``csrc/depthwise.h``, ``csrc/pointwise.h``,
``csrc/stem_conv.h``, ``csrc/im2col.h``, ``csrc/global_pool.h``, ``csrc/launch.h``): each
instantiation of a kernel template is one ``extern "C" int name(const int64_t* p, const float*
f)`` (the call's pointers and sizes, its float parameters), built in one unit through the kernel
cache and loaded as a ctypes function, once per process (:func:`build_entries` remembers each
unit it built).

Example:
    >>> entry_text("plait_f", "ns::entry<1>(p, f)")
    'extern "C" int plait_f(const int64_t* p, const float* f) { return ns::entry<1>(p, f); }\\n'
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Mapping
from importlib import resources
from typing import Any

from plait.codegen import build

ARGTYPES = [ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_float)]
# NOTE: each unit built in this process, by each of its entry names: (its entries in the
# unit's order, its text), what an export carries (:func:`unit_of`)
_UNITS: dict[str, tuple[tuple[str, ...], str]] = {}
# NOTE: each unit's ctypes functions by its source and calls, and the lock its first build holds
# (another unit builds meanwhile)
_Key = tuple[str, tuple[tuple[str, str], ...]]
_BUILT: dict[_Key, dict[str, Any]] = {}
_LOCKS: dict[_Key, threading.Lock] = {}
_LOCK = threading.Lock()


@functools.cache
def shipped(name: str) -> str:
    """The text of ``csrc/<name>`` as the package ships it (read once per process)."""
    return resources.files("plait.codegen").joinpath("csrc", name).read_text()


def entry_text(name: str, call: str) -> str:
    """The ``extern "C"`` entry ``name`` returning ``call`` (a template instantiation)."""
    return f'extern "C" int {name}(const int64_t* p, const float* f) {{ return {call}; }}\n'


def build_entries(source: str, calls: Mapping[str, str]) -> dict[str, Any]:
    """``source`` and an entry per ``calls`` item (name -> call) built as one unit, once per
    machine through the kernel cache (:func:`plait.codegen.build.build_units`, which raises
    :class:`~plait.codegen.errors.BuildError`) and once per process: each entry's ctypes
    function, by name (the same functions at every call with the same unit)."""
    key = (source, tuple(calls.items()))
    with _LOCK:
        lock = _LOCKS.setdefault(key, threading.Lock())
    with lock:
        found = _BUILT.get(key)
        if found is None:
            text = source + "\n" + "".join(entry_text(n, c) for n, c in calls.items())
            found = _BUILT[key] = _build(list(calls), text)
    return found


def _build(names: list[str], text: str) -> dict[str, Any]:
    unit = build.Unit(names, [text])
    build.build_units([unit], jobs=1)
    assert unit.lib is not None
    _UNITS.update(dict.fromkeys(names, (tuple(names), text)))
    found = {}
    for name in names:
        fn = getattr(unit.lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = ARGTYPES
        found[name] = fn
    return found


def unit_of(name: str) -> tuple[tuple[str, ...], str] | None:
    """The unit that entry ``name`` was built in by this process: its entry names in the
    unit's order and its text (:func:`plait.codegen.build.unit_file` finds its library), or
    None where no unit of it was built here."""
    return _UNITS.get(name)

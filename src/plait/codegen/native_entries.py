"""The C entries of plait's native convolution kernels (``csrc/depthwise.h``,
``csrc/pointwise.h``, ``csrc/stem_conv.h``): each instantiation of a kernel template is one
``extern "C" int name(const int64_t* p, const float* f)`` (the call's pointers and sizes, its
float parameters), built in one unit through the kernel cache and loaded as a ctypes function.

Example:
    >>> entry_text("plait_f", "ns::entry<1>(p, f)")
    'extern "C" int plait_f(const int64_t* p, const float* f) { return ns::entry<1>(p, f); }\\n'
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

from plait.codegen import build

ARGTYPES = [ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_float)]
# NOTE: each unit built in this process, by each of its entry names: (its entries in the
# unit's order, its text), what an export carries (:func:`unit_of`)
_UNITS: dict[str, tuple[tuple[str, ...], str]] = {}


def entry_text(name: str, call: str) -> str:
    """The ``extern "C"`` entry ``name`` returning ``call`` (a template instantiation)."""
    return f'extern "C" int {name}(const int64_t* p, const float* f) {{ return {call}; }}\n'


def build_entries(source: str, calls: Mapping[str, str]) -> dict[str, Any]:
    """``source`` and an entry per ``calls`` item (name -> call) built as one unit, once per
    machine through the kernel cache (:func:`plait.codegen.build.build_units`, which raises
    :class:`~plait.codegen.errors.BuildError`): each entry's ctypes function, by name."""
    text = source + "\n" + "".join(entry_text(n, c) for n, c in calls.items())
    unit = build.Unit(list(calls), [text])
    build.build_units([unit], jobs=1)
    assert unit.lib is not None
    _UNITS.update(dict.fromkeys(calls, (tuple(calls), text)))
    found = {}
    for name in calls:
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

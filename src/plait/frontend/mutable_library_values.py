"""Library objects a program reads whose state changes in place: how a value key sees them.

A library's object is compared by identity in a value key (:mod:`plait.frontend.pyvalues`), which
is sound while its state cannot change under the same identity. Two kinds can, and a capture
bakes in what it read of them:

- a NumPy array: ``float(table[0])``, ``torch.tensor(table)`` or ``table.sum()`` become literals
  of the graph, and ``table[0] = 5`` changes neither the array's identity nor any dict's
  version. An array is compared by its contents (dtype, shape and bytes; a digest of the bytes
  past :data:`INLINE_BYTES`), read again on every call. An array of Python objects cannot be
  compared so: the capture is refused.
- an iterator or generator: ``next(it)`` at capture yields one value, and the graph would repeat
  it on every call. One is compared by its position (a generator: where it is suspended and its
  locals; a list's or range's iterator: what it pickles to), so a program that advances it
  changes a value it read while it runs, and is refused as such a program is (the documented
  eager fallback, with a warning); one whose position cannot be read is refused at once. A
  generator that yields the same value from the same place (``while True: yield k``) keeps its
  graph, guarded by ``k``. File objects are iterators too; they stay compared by identity (what
  is written to them is a side effect, not a value the program computes with).

- a standard library container (``collections.deque``, ``bytearray``, ``array.array``,
  ``memoryview``, ``ChainMap``, a ``MappingProxyType``) is compared by its items, as a list is;
  a ``weakref.ref`` by the object it refers to; a ``contextvars.ContextVar`` by its value in
  the calling context; a ``threading.local`` by the calling thread's attributes.
- a ``logging.Logger`` (``if log.isEnabledFor(logging.DEBUG):``, ``log.level``): by the level,
  ``disabled`` flag and parent of each logger up its hierarchy and ``logging.disable``'s level
  (natively, the version tags of their dicts), so ``log.setLevel`` recompiles.
- a getter of process state PyTorch implements in C (:data:`READERS`: ``torch.is_anomaly_enabled``
  ...): by its answer, asked on every call (natively, one C call); one that takes a device type
  (:data:`PER_DEVICE_READERS`: ``torch.get_autocast_dtype``) by its answer for each device.
- a ``functools.lru_cache``/``functools.cache`` function: by identity here; the results its
  cache holds are a root of their own (:mod:`plait.frontend.library_reads`).
- the clock (``time.time``, ``time.perf_counter`` ...): a value computed from a reading would be
  fixed in the graph. Whether it reaches a tensor cannot be told (programs also time
  themselves), so a program that names a clock function is compiled with a warning
  (:data:`CLOCKS`).

Example:
    >>> import numpy as np
    >>> a = np.arange(3.0)
    >>> before = array_key(a)
    >>> a[0] = 5.0
    >>> array_key(a) == before
    False
"""

from __future__ import annotations

import array
import collections
import contextvars
import datetime
import functools
import hashlib
import io
import logging
import sys
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from plait.errors import ClockReadWarning, GraphCaptureError

_UNSET = object()  # NOTE: a context variable without a value (nor a default)
INLINE_BYTES = 1 << 16  # NOTE: an array's bytes kept as they are up to this; a digest past it
# NOTE: functions whose every call reads the clock anew
CLOCKS = frozenset(
    getattr(time, name)
    for name in (
        "time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
        "process_time", "process_time_ns", "thread_time", "thread_time_ns", "localtime",
        "gmtime", "ctime", "asctime", "strftime",
    )
    if hasattr(time, name)
) | frozenset(
    {datetime.datetime.now, datetime.datetime.utcnow, datetime.datetime.today,
     datetime.date.today}
)  # fmt: skip


# NOTE: the check kinds of the Python values guard these keys make (plait.frontend.pyvalues's)
_ITEMS, _LIST, _CALL = 0, 5, 8
CACHED = functools._lru_cache_wrapper
# NOTE: getters of process state (PyTorch's, in C) that no guard of every specialization covers
READERS = tuple(
    f
    for f in (
        torch.is_anomaly_enabled, torch.is_anomaly_check_nan_enabled,
        torch.is_autocast_cache_enabled, torch.get_num_interop_threads,
        getattr(torch._C, "_get_warnAlways", None),
        getattr(torch._C, "_get_cudnn_deterministic", None),
        getattr(torch._C, "_get_cudnn_benchmark", None),
        getattr(torch._C, "_get_mkldnn_deterministic", None),
        getattr(torch._C, "_get_deterministic_fill_uninitialized_memory", None),
    )
    if f is not None
)  # fmt: skip
_READER_IDS = frozenset(map(id, READERS))
# NOTE: getters of process state that take a device type: asked for each device type
# (torch.get_autocast_dtype("cpu") is read by a program whether or not autocast is on)
PER_DEVICE_READERS = (torch.get_autocast_dtype,)
_PER_DEVICE_IDS = frozenset(map(id, PER_DEVICE_READERS))
_DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "privateuseone", "mtia", "ipu",
                 "maia")  # fmt: skip


def _answered(device: str) -> bool:
    try:
        torch.get_autocast_dtype(device)
    except Exception:  # NOTE: a device type this build's autocast does not know
        return False
    return True


# NOTE: every device type autocast answers for here (a program may ask any of them)
_DEVICES = tuple(filter(_answered, _DEVICE_TYPES))


def library_key(
    v: Any, key: Callable[[Any], Any], same: Callable[[Any], Any]
) -> tuple[Any, list[tuple[Any, ...]], list[Any]] | None:
    """What a logger, a getter of :data:`READERS` or a functools cache is compared by (None for
    anything else), with the native checks of that key and the objects whose roots it adds
    (see the module doc); ``key`` keys a part by value, ``same`` by identity."""
    if type(v) is CACHED:
        return ("cached", same(v)), [], [v]
    if id(v) in _READER_IDS:
        try:
            value = v()
        except Exception:  # NOTE: a getter this build cannot answer: by identity
            return None
        return ("reader", same(v), key(value)), [(_CALL, v, value)], []
    if id(v) in _PER_DEVICE_IDS:
        asks = [functools.partial(v, device) for device in _DEVICES]
        answers = [ask() for ask in asks]
        checks: list[tuple[Any, ...]] = [(_CALL, a, x) for a, x in zip(asks, answers)]
        return ("reader", same(v), key(tuple(answers))), checks, []
    if isinstance(v, logging.Logger) and type(v).__module__ == "logging":
        return _logger_key(v, same)  # NOTE: a user's subclass: by contents, as a user object
    return None


def _logger_key(
    v: logging.Logger, same: Callable[[Any], Any]
) -> tuple[Any, list[tuple[Any, ...]], list[Any]]:
    """A logger by what ``isEnabledFor``, ``getEffectiveLevel`` and ``hasHandlers`` read: each
    logger's level, ``disabled`` and ``propagate`` flags and handlers (the list, changed in place
    by ``addHandler``: by its items) up its parents, and the manager's ``disable`` level."""
    parts: list[Any] = []
    checks: list[tuple[Any, ...]] = []
    node: Any = v
    while isinstance(node, logging.Logger) and len(parts) < 64:
        own = vars(node)
        names = tuple(
            n for n in ("level", "disabled", "propagate", "handlers", "parent") if n in own
        )
        checks.append((_ITEMS, own, names, tuple(own[n] for n in names)))
        handlers = own.get("handlers")
        if type(handlers) is list:
            checks.append((_LIST, handlers, tuple(handlers)))
        held = tuple(map(same, handlers)) if isinstance(handlers, list) else None
        parts.append(
            (same(node), own.get("level"), own.get("disabled"), own.get("propagate"), held)
        )
        node = own.get("parent")
    manager = vars(getattr(v, "manager", None) or logging.Logger.manager)
    at = "_disable" if "_disable" in manager else "disable"  # NOTE: a property over it (3.7+)
    checks.append((_ITEMS, manager, (at,), (manager.get(at),)))
    return ("logger", tuple(parts), manager.get(at)), checks, []


def array_key(v: Any) -> tuple[Any, ...] | None:
    """What a NumPy array is compared by (None for anything else); raises for one of objects."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(v, np.ndarray):
        return None
    if v.dtype.hasobject:
        raise GraphCaptureError(
            "Python state",
            "the program reads a NumPy array of Python objects, whose elements cannot be "
            "guarded; pass its values as a tensor argument",
            kind="limitation",
        )
    data = np.ascontiguousarray(v).tobytes()
    if len(data) > INLINE_BYTES:
        data = hashlib.blake2b(data, digest_size=32).digest()
    mask = np.ma.getmaskarray(v).tobytes() if isinstance(v, np.ma.MaskedArray) else b""
    return (type(v), "array", v.dtype.str, tuple(v.shape), data, mask)


def container_key(v: Any, key: Callable[[Any], Any]) -> tuple[Any, ...] | None:
    """What a standard library container is compared by, ``key`` keying its items (None for
    anything else): a deque by its items and bound, a ``bytearray``, ``array.array`` or
    ``memoryview`` by its bytes, a mapping proxy or ``ChainMap`` by its mappings, a
    ``weakref.ref`` by the object it refers to (``None`` once that is gone), a ``ContextVar``
    by its value here, a ``threading.local`` by this thread's attributes."""
    cls = type(v)
    if isinstance(v, collections.deque):
        return (cls, "deque", v.maxlen, tuple(key(x) for x in v))
    if isinstance(v, bytearray):
        return (cls, "bytes", bytes(v))
    if isinstance(v, array.array):
        return (cls, "array", v.typecode, v.tobytes())
    if isinstance(v, weakref.ref) and not isinstance(v, weakref.WeakMethod):
        return (cls, "weakref", key(v()))
    if isinstance(v, contextvars.ContextVar):
        return (cls, "contextvar", v.name, key(v.get(_UNSET)))
    if isinstance(v, threading.local):
        return (cls, "local", key(dict(vars(v))))
    if isinstance(v, types.MappingProxyType):
        return (cls, "mapping", key(dict(v)))
    if isinstance(v, collections.ChainMap):
        return (cls, "chainmap", key(list(v.maps)))
    if isinstance(v, memoryview):
        if v.obj is None:  # NOTE: released
            return (cls, "released")
        return (cls, "memoryview", v.format, v.shape, v.tobytes())
    return None


def iterator_key(v: Any, key: Callable[[Any], Any]) -> tuple[Any, ...] | None:
    """What an iterator of a library type is compared by, ``key`` keying its parts (None for
    anything else): a generator by its code, where it is suspended and its locals; an iterator
    that pickles its position (a list's, a range's, a tuple's, ``enumerate``'s ...) by what it
    pickles to. Raises for one whose position cannot be read (a file object is compared by
    identity: what is written to it is a side effect, not a value the program computes with)."""
    if not isinstance(v, Iterator) or isinstance(v, io.IOBase):
        return None
    if isinstance(v, types.GeneratorType):
        frame = v.gi_frame
        if frame is None:
            return (type(v), key(v.gi_code), "finished")
        return (type(v), key(v.gi_code), frame.f_lasti, key(dict(frame.f_locals)))
    if type(v).__reduce__ is not object.__reduce__:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # NOTE: itertools' pickling is deprecated
                state = v.__reduce__()
        except Exception:  # NOTE: an iterator that refuses to pickle: no readable position
            state = None
        if isinstance(state, tuple):
            return (type(v), "iterator", key(state))
    raise GraphCaptureError(
        "Python state",
        f"the program reads a {type(v).__name__} (an iterator) whose position cannot be read: "
        "the values it yields at capture would be repeated on every call; pass what it "
        "yields as an argument",
        kind="limitation",
    )


def warn_of_clocks(reads: Iterable[tuple[str, Any]]) -> None:
    """Warn (:class:`~plait.errors.ClockReadWarning`) if any of ``reads`` (each a read's name
    and the value it found) is a clock function."""
    found = sorted({name for name, v in reads if _is_clock(v)})
    if found:
        warnings.warn(
            f"the program reads the clock ({', '.join(found)}) while it is captured: a value "
            "computed from that reading is fixed in the compiled program, where eager reads "
            "the clock on every call; pass the reading as an argument if a result depends on it",
            ClockReadWarning,
            stacklevel=2,
        )


def _is_clock(v: Any) -> bool:
    if not callable(v):
        return False
    try:
        return v in CLOCKS
    except (TypeError, ValueError):  # NOTE: an unhashable value is no clock function
        return False

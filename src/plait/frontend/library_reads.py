"""Process state a program reads through library code, where a value compared by identity
misses a change.

A library's function runs without its reads being recorded (its module is pinned by the
toolchain versions: :mod:`plait.frontend.code_origin`), and a library's object is compared by
identity (:mod:`plait.frontend.pyvalues`). Where what such code answers depends on state a
user changes between calls, the capture records that state as roots of the Python values
guard, so a change recompiles:

- ``torch.backends.mha.get_fastpath_enabled()`` (called by the program, or by
  ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``): the module global it returns,
  whenever a frame of it runs (:data:`FRAME_READS`); ``torch.is_warn_always_enabled()`` likewise;
- a ``logging.Logger`` whose ``isEnabledFor`` or ``getEffectiveLevel`` runs, or that
  ``logging.getLogger`` returns, for the program's code (a library's own logging, and plait's,
  decide nothing the program computes): the logger, compared by its levels up its hierarchy
  (:func:`plait.frontend.mutable_library_values.library_key`), so ``log.setLevel`` recompiles;
- a property of a module object the program names (``torch.backends.cudnn.deterministic``,
  ``torch.utils.deterministic.fill_uninitialized_memory``): its value, read on every call
  (natively, the property's C getter) (:func:`module_property_roots`);
- a ``functools.lru_cache``/``functools.cache`` function the program reads: the results its
  cache holds when the capture ends (:func:`cache_entries_root`). Eager returns a cached result
  until the cache is cleared or the entry evicted, whatever the function would compute now, and
  the graph holds the result the capture got: so the guard holds while each entry holds the
  same result (an entry added for other arguments changes nothing); a cleared or refilled cache
  recompiles, and a capture that runs the function records what it reads, as any user code.
  A cache whose table cannot be found (another Python's layout) refuses the capture (the loud
  eager fallback).

Example:
    >>> import functools
    >>> @functools.cache
    ... def scale(n):
    ...     return 2.0 * n
    >>> _ = scale(3)
    >>> root = cache_entries_root(scale, "scale")
    >>> root.read()
    (6.0,)
    >>> scale.cache_clear()
    >>> root.read()
    (<absent>,)
"""

from __future__ import annotations

import functools
import gc
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.backends.mha

from plait.errors import GraphCaptureError, UnknownNameError
from plait.frontend.code_origin import is_pinned
from plait.frontend.mutable_library_values import CACHED
from plait.frontend.pyvalues import ABSENT, ITEMS, TYPE, Root, namespace_root, value_key

CALL = 8  # NOTE: the native check kind ``(8, fn, value)``: ``fn() is value``
_MHA = "torch.backends.mha"
_FASTPATH = "_is_fastpath_enabled"
Found = list[tuple[tuple[Any, ...], Root]]


def fastpath_root() -> Root:
    """``torch.backends.mha.get_fastpath_enabled()``: the module global it returns."""
    show = f"{_MHA}.get_fastpath_enabled()"
    return namespace_root(vars(torch.backends.mha), _FASTPATH, show, ["global", _MHA, _FASTPATH])


def _fastpath(frame: types.FrameType) -> Found:
    return [(("item", id(vars(torch.backends.mha)), _FASTPATH), fastpath_root())]


def _warn_always(frame: types.FrameType) -> Found:
    getter = torch._C._get_warnAlways
    desc = ["getter", "torch._C", "_get_warnAlways"]
    return [(("reader", id(getter)), getter_root(getter, "torch.is_warn_always_enabled()", desc))]


def getter_root(getter: Callable[[], Any], show: str, desc: list[Any] | None = None) -> Root:
    """The answer of ``getter`` (no arguments, no side effects), asked again on every call."""
    return Root(show, getter, desc, lambda v: (CALL, getter, v))


def logger_root(logger: logging.Logger) -> Root:
    """A logger, compared by its levels (the value key of a logger)."""
    show = f"the logger {logger.name!r}"
    return Root(show, lambda: logger, ["logger", logger.name], lambda v: (TYPE, v, type(v)))


def _by_the_program(frame: types.FrameType) -> bool:
    """Whether the code nearest ``frame`` up its callers that is not a library's is the
    program's (not plait's, nor none: a library's own logging, PyTorch's loggers made and set
    as plait's ATen tracing imports them, decides nothing the program computes)."""
    f = frame.f_back
    while f is not None:
        module = str(f.f_globals.get("__name__", ""))
        if module == "plait" or module.startswith("plait."):
            return False
        if not is_pinned(module):
            return True
        f = f.f_back
    return False


def _self_logger(frame: types.FrameType) -> Found:
    logger = frame.f_locals.get("self")
    if not isinstance(logger, logging.Logger) or not _by_the_program(frame):
        return []
    return [(("logger", id(logger)), logger_root(logger))]


def _named_logger(frame: types.FrameType) -> Found:
    """``logging.getLogger(name)`` or ``Manager.getLogger(name)`` at its start: the logger it
    returns (asking for it here makes it, as the call is about to)."""
    name = frame.f_locals.get("name")
    manager = frame.f_locals.get("self", logging.Logger.manager)
    if not _by_the_program(frame):
        return []
    if name is None or name == logging.root.name:
        logger: Any = logging.root
    elif isinstance(name, str) and isinstance(manager, logging.Manager):
        logger = manager.getLogger(name)
    else:
        return []
    return [(("logger", id(logger)), logger_root(logger))]


# NOTE: a library function's code -> the roots a frame of it reads; PyReads sees every frame of
# these (not only the first of each code) and records nothing else of them
FRAME_READS: dict[types.CodeType, Callable[[types.FrameType], Found]] = {
    torch.backends.mha.get_fastpath_enabled.__code__: _fastpath,
    logging.Logger.isEnabledFor.__code__: _self_logger,
    logging.Logger.getEffectiveLevel.__code__: _self_logger,
    logging.getLogger.__code__: _named_logger,
    logging.Manager.getLogger.__code__: _named_logger,
}
if isinstance(torch.is_warn_always_enabled, types.FunctionType):
    FRAME_READS[torch.is_warn_always_enabled.__code__] = _warn_always


def _module_property(module: types.ModuleType, name: str) -> Callable[[], Any] | None:
    """The getter of ``module.name`` when its class (a subclass of the module type, as
    ``torch.backends.cudnn``'s) defines it as a property, else None."""
    for cls in type(module).__mro__:
        if cls is types.ModuleType:
            return None
        found = vars(cls).get(name)
        if found is None:
            continue
        getter = getattr(found, "getter", None)  # NOTE: torch.backends.ContextProp
        if type(found).__name__ == "ContextProp" and callable(getter):
            return getter
        if isinstance(found, property):
            return functools.partial(getattr, module, name)
        return None
    return None


def module_property_roots(module: types.ModuleType, names: set[str]) -> Found:
    """Roots for the properties of ``module``'s own class among ``names`` (see the module
    doc)."""
    out: Found = []
    if type(module) is types.ModuleType:
        return out
    for name in sorted(names):
        getter = _module_property(module, name)
        if getter is not None:
            show = f"{module.__name__}.{name}"
            root = getter_root(getter, show, ["modprop", module.__name__, name])
            out.append((("modprop", id(module), name), root))
    return out


def cache_table(wrapper: Any) -> dict | None:
    """The dict a functools cache keeps its entries in (None where this Python's layout is not
    the one read here). NOTE: CPython's ``_lru_cache_wrapper`` gives the collector, in order,
    its type, each entry of its list (key, result, link type), then its table, its function,
    its keyword marker, two types and its instance dict."""
    refs = gc.get_referents(wrapper)
    size = wrapper.cache_info().currsize
    if len(refs) < 6:
        return None
    table = refs[-6]
    if type(table) is not dict or len(table) != size or refs[-5] is not wrapper.__wrapped__:
        return None
    return table


def _cached_results(wrapper: Any, table: dict) -> dict | None:
    """Each entry's result of a bounded cache (whose table holds the entries' links)."""
    refs = gc.get_referents(wrapper)
    link, start = refs[-3], 1 if refs and refs[0] is type(wrapper) else 0
    items = [r for r in refs[start:-6] if r is not link]
    if len(items) != 2 * len(table):
        return None
    return dict(zip(items[0::2], items[1::2]))


def drop_capture_entries(wrapper: Any, show: str, made: Callable[[Any], bool]) -> str | None:
    """Where ``wrapper``'s cache holds a result that holds a tensor of the capture (``made``)
    under a key that holds none (the program's run during the capture computed it): those
    entries are taken out (a bounded cache's links cannot be, one by one: it is cleared), so
    the eager run that follows fills them with eager's tensors, and the refusal's message is
    returned; else None. Left in the cache, every later call, eager or compiled, would read
    the capture's tensor. NOTE: an entry under a key of the capture's (an argument the program
    computed) is left: no later call asks for that key."""
    table = cache_table(wrapper)
    if table is None:
        return None  # NOTE: cache_entries_root refuses it
    bounded = wrapper.cache_parameters()["maxsize"] is not None
    results = (_cached_results(wrapper, table) or {}) if bounded else table
    stored = [k for k, v in list(results.items()) if made(v) and not made(k)]
    if not stored:
        return None
    if bounded:
        wrapper.cache_clear()
    for k in stored:
        table.pop(k, None)
    return (
        f"the program stores a tensor it computes in the functools cache {show}, which a "
        "compiled call would not fill; the entries are taken out and this call runs eagerly"
    )


def cache_entries_root(wrapper: Any, show: str) -> Root | None:
    """The results ``wrapper``'s cache holds now, for each key it holds now (see the module
    doc); None when it holds none. Raises :class:`GraphCaptureError` where its table cannot
    be read."""
    assert type(wrapper) is CACHED
    table = cache_table(wrapper)
    if table is None:
        raise GraphCaptureError(
            "Python state",
            f"the program calls {show}, a functools cache whose entries plait cannot read in "
            "this Python: the results it returns could not be guarded",
            kind="limitation",
        )
    keys = tuple(table)
    if not keys:
        return None
    name = f"the results cached by {show}"
    if wrapper.cache_parameters()["maxsize"] is None:
        # NOTE: an unbounded cache's table holds the results: natively, its version tag

        def read() -> Any:
            return tuple(table.get(k, ABSENT) for k in keys)

        return Root(name, read, None, lambda v: (ITEMS, table, keys, v))

    if _cached_results(wrapper, table) is None:
        raise GraphCaptureError(
            "Python state",
            f"the program calls {show}, a functools cache whose results plait cannot read in "
            "this Python: the results it returns could not be guarded",
            kind="limitation",
        )

    # NOTE: a bounded cache's table holds links whose results change in place: an evicted
    # entry's link is reused, on a miss. Natively, each key holds its link of now (a cleared
    # cache's links are gone: those kept here make new ones other objects) and no miss was
    # counted since the results were last found equal to now's (each miss: a Python read)
    links = tuple(table[k] for k in keys)
    first = tuple((_cached_results(wrapper, table) or {}).get(k, ABSENT) for k in keys)
    verified = [wrapper.cache_info().misses, links, value_key(first)]

    def read_bounded() -> Any:
        misses = wrapper.cache_info().misses
        now = tuple(table.get(k) for k in keys)
        if misses == verified[0] and all(a is b for a, b in zip(now, verified[1], strict=True)):
            return first
        results = _cached_results(wrapper, table) or {}
        out = tuple(results.get(k, ABSENT) for k in keys)
        if value_key(out) == verified[2]:
            verified[:2] = [misses, now]
        return out

    def unmissed() -> bool:
        return bool(wrapper.cache_info().misses == verified[0])

    checks = ((ITEMS, table, keys, links), (CALL, unmissed, True))
    return Root(name, read_bounded, None, lambda v: checks)


def resolve_library(desc: list[Any]) -> Root:
    """The root a ``"logger"``, ``"modprop"`` or ``"getter"`` description names in this
    process."""
    if desc[0] == "logger":
        name = desc[1]
        found: Any = logging.root if name == logging.root.name else None
        found = found or logging.Logger.manager.loggerDict.get(name)
        if not isinstance(found, logging.Logger):
            raise UnknownNameError(f"no logger {name!r}")
        return logger_root(found)
    module = sys.modules.get(desc[1])
    if desc[0] == "getter":
        getter = getattr(module, desc[2], None)
    else:
        getter = None if module is None else _module_property(module, desc[2])
    if getter is None:
        raise UnknownNameError(f"no property {desc[2]} of module {desc[1]}")
    return getter_root(getter, f"{desc[1]}.{desc[2]}", desc)


__all__ = [
    "FRAME_READS",
    "cache_entries_root",
    "cache_table",
    "drop_capture_entries",
    "getter_root",
    "logger_root",
    "module_property_roots",
    "resolve_library",
]

"""Flatten nested program inputs and outputs into leaves, with readable paths, and rebuild them.

Containers: tuple, list, dict (and dict subclasses), namedtuples and dataclass instances (model
output dataclasses). Everything else is a leaf. A spec is a hashable nested tuple, so two calls
with the same structure have equal specs (a cheap guard).

Example:
    >>> spec, leaves, paths = flatten({"a": (1, 2), "b": [3]}, "x")
    >>> leaves, paths
    ([1, 2, 3], ["x['a'][0]", "x['a'][1]", "x['b'][0]"])
    >>> unflatten(spec, [10, 20, 30])
    {'a': (10, 20), 'b': [30]}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

Spec = tuple[Any, ...]
LEAF: Spec = ("*",)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _dataclass_fields(obj: Any) -> list[str] | None:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj) if f.init]
    return None


def flatten(obj: Any, path: str) -> tuple[Spec, list[Any], list[str]]:
    """Return ``(spec, leaves, paths)`` for ``obj``; ``path`` names ``obj`` itself."""
    leaves: list[Any] = []
    paths: list[str] = []
    spec = _flatten(obj, path, leaves, paths)
    return spec, leaves, paths


def _flatten(obj: Any, path: str, leaves: list[Any], paths: list[str]) -> Spec:
    if _is_namedtuple(obj):
        kids = tuple(_flatten(v, f"{path}.{f}", leaves, paths) for f, v in zip(obj._fields, obj))
        return ("namedtuple", type(obj), kids)
    if type(obj) in (tuple, list):
        kids = tuple(_flatten(v, f"{path}[{i}]", leaves, paths) for i, v in enumerate(obj))
        return (type(obj).__name__, len(obj), kids)
    fields = _dataclass_fields(obj)
    if fields is not None:
        kids = tuple(_flatten(getattr(obj, f), f"{path}.{f}", leaves, paths) for f in fields)
        return ("dataclass", type(obj), tuple(fields), kids)
    if isinstance(obj, dict):
        keys = tuple(obj)
        kids = tuple(_flatten(obj[k], f"{path}[{k!r}]", leaves, paths) for k in keys)
        return ("dict", type(obj), keys, kids)
    leaves.append(obj)
    paths.append(path)
    return LEAF


def unflatten(spec: Spec, leaves: list[Any]) -> Any:
    """Rebuild the structure described by ``spec`` from ``leaves`` (in flatten order)."""
    it = iter(leaves)
    out = _build(spec, it)
    if next(it, _END) is not _END:
        raise ValueError("unflatten: more leaves than the spec holds")
    return out


_END = object()


def _build(spec: Spec, it: Iterator[Any]) -> Any:
    tag = spec[0]
    if tag == "*":
        value = next(it, _END)
        if value is _END:
            raise ValueError("unflatten: fewer leaves than the spec holds")
        return value
    if tag in ("tuple", "list"):
        items = [_build(s, it) for s in spec[2]]
        return tuple(items) if tag == "tuple" else items
    if tag == "namedtuple":
        return spec[1](*[_build(s, it) for s in spec[2]])
    if tag == "dataclass":
        values = {f: _build(s, it) for f, s in zip(spec[2], spec[3])}
        return spec[1](**values)
    if tag == "dict":
        cls, keys, kids = spec[1], spec[2], spec[3]
        pairs = [(k, _build(s, it)) for k, s in zip(keys, kids)]
        return dict(pairs) if cls is dict else cls(pairs)
    raise ValueError(f"unflatten: bad spec tag {tag!r}")


def map_leaves(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Apply ``fn`` to every leaf of ``obj`` and rebuild it."""
    spec, leaves, _ = flatten(obj, "")
    return unflatten(spec, [fn(x) for x in leaves])

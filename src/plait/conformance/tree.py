"""Nested structures of tensors: flatten to named leaves and map over tensor leaves.

Our own tiny pytree (tuples, lists, namedtuples, dicts, dataclass instances), so the gate
depends on no private torch module. Leaf names read like Python: ``output[0]['logits']``,
``output.hidden``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch


def leaves(obj: Any, name: str) -> list[tuple[str, Any]]:
    """Every leaf of ``obj`` with its path, in a deterministic order.

    Example:
        >>> [n for n, _ in leaves((1, {"a": 2}), "output")]
        ['output[0]', "output[1]['a']"]
    """
    if isinstance(obj, Mapping):
        out: list[tuple[str, Any]] = []
        for key in obj:
            out += leaves(obj[key], f"{name}[{key!r}]")
        return out
    if _is_dataclass(obj):
        out = []
        for f in dataclasses.fields(obj):
            out += leaves(getattr(obj, f.name), f"{name}.{f.name}")
        return out
    if isinstance(obj, list | tuple):
        out = []
        for i, item in enumerate(obj):
            out += leaves(item, f"{name}[{i}]")
        return out
    return [(name, obj)]


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """Rebuild ``obj`` with ``fn`` applied to every tensor leaf; other leaves are kept."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return type(obj)({k: map_tensors(fn, v) for k, v in obj.items()})  # type: ignore[call-arg]
    if _is_dataclass(obj):
        new = copy.copy(obj)  # NOTE: no __init__ (a field may be init=False, or frozen)
        for f in dataclasses.fields(obj):
            object.__setattr__(new, f.name, map_tensors(fn, getattr(obj, f.name)))
        return new
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(fn, v) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(fn, v) for v in obj)
    return obj


def tensors(obj: Any) -> list[torch.Tensor]:
    """The tensor leaves of ``obj``, in :func:`leaves` order."""
    return [leaf for _, leaf in leaves(obj, "") if isinstance(leaf, torch.Tensor)]


def skeleton(obj: Any) -> Any:
    """The nesting of ``obj`` without its values: which containers (tuple, list, a namedtuple by
    its class name, a mapping by its keys), in what order, and which leaves are ``None``.

    Example:
        >>> skeleton((1, [None, {"a": 2}]))
        ('tuple', 'leaf', ('list', 'None', ('mapping', ('a', 'leaf'))))
    """
    if isinstance(obj, Mapping):
        return ("mapping", *((key, skeleton(obj[key])) for key in obj))
    if _is_dataclass(obj):
        fields = dataclasses.fields(obj)
        return (type(obj).__name__, *((f.name, skeleton(getattr(obj, f.name))) for f in fields))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (type(obj).__name__, *(skeleton(item) for item in obj))
    if isinstance(obj, list | tuple):
        kind = "list" if isinstance(obj, list) else "tuple"
        return (kind, *(skeleton(item) for item in obj))
    return "None" if obj is None else "leaf"


def _is_dataclass(obj: Any) -> bool:
    """A dataclass instance (not the class): its fields are its children."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)

"""Python values the program read and then stored a traced tensor in, put back when its capture
ends without a program.

A program may memoize a tensor in a container it reads (timm's LeViT and EfficientFormer fill
``self.attention_bias_cache[device]`` on their first eval call). Capture refuses a program that
changes a value it reads (:mod:`plait.frontend.pyreads`), or starts again, and the call runs
eagerly; by then the capture's run has stored one of its tracers there. The eager run, a capture
tried again and every later call would find that tracer and read the capture's value, which
:func:`plait.frontend.continuation._refuse_kept` refuses: every call of the model raised.
:class:`Originals` keeps each module attribute, global and closure value (a hook's log list)
as the program first read it (the
binding, and a shallow copy of each list, dict and user object's attributes it holds, at any
depth: ``self.state.scale = t`` on a plain object, a dataclass or a ``SimpleNamespace``), and
:meth:`Originals.restore` puts back those that now hold a tracer they did not hold, so the eager
run fills the memo itself, as eager does. :meth:`Originals.changes` says what the program stored
(:mod:`plait.frontend.store_sites` finds the line for the message).

NOTE: values that hold no tracer are left as the capture left them: a flag may guard a side
effect plait cannot undo (an install-once hook), so putting it back is not sound in general
(docs/capture.md, "Known limitation"; tests/capture/test_fallback_python_state.py).

Example:
    >>> ns = {"cache": {}}
    >>> o = Originals()
    >>> o.note(ns, "cache", ns["cache"])
    >>> ns["cache"]["k"] = 1  # not a tracer: left as it is
    >>> o.restore(); ns
    {'cache': {'k': 1}}
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import MutableMapping
from typing import Any

import torch
from torch import nn

from plait.errors import GraphCaptureError
from plait.frontend.capture_values import Tracer
from plait.frontend.pyvalues import _MAX_DEPTH, ABSENT, _is_value_object
from plait.frontend.state import holds_made
from plait.frontend.store_sites import store_line

# NOTE: a store the program made into a value it read, for the message that refuses it: how
# (``bind``: the binding itself; ``attr``: an attribute of an object; ``item``: a dict's key;
# ``list``: a list's items), the name stored (or None) and the names the value was reached by
Store = tuple[str, "str | None", tuple[str, ...]]


class Originals:
    """Module attributes and globals as the program first read them, with what they hold."""

    def __init__(self) -> None:
        # NOTE: (namespace, name, value read)
        self._seen: dict[tuple[int, str], tuple[MutableMapping[str, Any], str, Any]] = {}
        # NOTE: each list, dict and user object's namespace those values hold (at any depth),
        # as first read: (the container, "list" | "item" | "attr", a shallow copy, the names
        # it was reached by)
        self._held: dict[int, tuple[Any, str, Any, tuple[str, ...]]] = {}
        self._keep: list[Any] = []  # NOTE: the objects of _held's keys, alive while noted
        self._cells: dict[str, Any] = {}  # NOTE: closure values noted (note_closure)
        self.put_back = False  # NOTE: whether a restore put anything back

    def note(self, namespace: MutableMapping[str, Any], name: str, value: Any) -> None:
        """``namespace[name]`` was first read as ``value`` (``ABSENT``: not there)."""
        key = (id(namespace), name)
        if key in self._seen:
            return
        self._seen[key] = (namespace, name, value)
        cls = type(value)
        if cls in _LEAVES or value is ABSENT:
            return
        if cls is tuple and all(type(x) in _LEAVES for x in value):
            return  # NOTE: a module's sizes and flags (stride, padding): nothing to put back
        if (cls is dict or cls is OrderedDict) and not value:
            # NOTE: most reads: a module's empty hook tables; as the walk below records them
            if id(value) not in self._held:
                self._keep.append(value)
                self._held[id(value)] = (value, "item", {}, (name,))
            return
        stack: list[tuple[Any, tuple[str, ...], int]] = [(value, (name,), 0)]
        held = self._held
        while stack:
            v, names, depth = stack.pop()
            if id(v) in held or depth > _MAX_DEPTH:
                continue
            if isinstance(v, tuple):
                stack.extend((x, names, depth + 1) for x in v)
                continue
            items = _contents(v)
            if items is None:
                continue
            container, kind = items
            self._keep.append(v)
            if kind == "list":
                items_now = list.copy(v)
                held[id(v)] = (container, kind, items_now, names)
                stack.extend((x, names, depth + 1) for x in items_now)
                continue
            copied = dict(dict.items(container))
            held[id(v)] = (container, kind, copied, names)
            for k, x in copied.items():
                more = (*names, k) if isinstance(k, str) else names
                stack.append((x, more, depth + 1))

    def note_closure(self, value: Any) -> None:
        """A closure variable's value as its function's frame first read it (a hook's log list):
        what it holds is put back as a binding's contents are. NOTE: by the value's identity,
        in a namespace of this object's own (its cell is found only once the frame ended)."""
        name = f"closure value {id(value)}"
        self._cells.setdefault(name, value)
        self.note(self._cells, name, value)

    def namespaces(self) -> list[MutableMapping[str, Any]]:
        """Each namespace (a module's ``__dict__``, globals) the program read a name of."""
        return list({id(ns): ns for ns, _, _ in self._seen.values()}.values())

    def changes(self) -> list[Store]:
        """The stores the program made into what it read: bindings first, then contents."""
        out: list[Store] = []
        for namespace, name, value in self._seen.values():
            if namespace.get(name, ABSENT) is not value:
                out.append(("bind", name, ()))
        for container, kind, copied, names in self._held.values():
            if kind == "list":
                if _differ(container, copied):
                    out.append(("list", None, names))
                continue
            for k in dict.keys(container) | copied.keys():
                if dict.get(container, k, ABSENT) is not copied.get(k, ABSENT):
                    out.append((kind, k if isinstance(k, str) else None, names))
        return out

    def refused(self, changed: list[str], codes: list[Any]) -> GraphCaptureError:
        """The error that refuses a program that changed the values ``changed`` names (it
        read them), at the line of ``codes`` (the program's functions that ran) that made the
        first store found there; what it stored of a capture's tensors is put back first."""
        where = store_line(codes, self.changes())
        self.restore()  # NOTE: the eager run makes the changes once, from the start
        return GraphCaptureError(
            "Python state",
            "the program changes Python values it reads while it runs "
            f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}); a compiled "
            "program would not replay that",
            kind="limitation",
            filename=where[0] if where else None,
            lineno=where[1] if where else None,
            code=where[2] if where else None,
        )

    def restore(self) -> None:
        """Puts back each binding that now holds a tracer (alone or in what it holds), each
        list read that now holds one it did not, and each key of a dict or attribute of a user
        object read that does (``put_back`` then says so)."""
        for namespace, name, value in self._seen.values():
            now = namespace.get(name, ABSENT)
            if now is not value and holds_tracer(now):
                self.put_back = True
                if value is ABSENT:
                    namespace.pop(name, None)
                else:
                    namespace[name] = value
        for container, kind, copied, _ in self._held.values():
            if kind == "list":
                if _differ(container, copied) and holds_tracer(container):
                    self.put_back = True
                    list.__setitem__(container, slice(None), copied)
                continue
            # NOTE: through dict's own methods: a subclass's (a registry's) may do more
            for k, v in list(dict.items(container)):
                if v is not copied.get(k, ABSENT) and holds_tracer(v):
                    self.put_back = True
                    if k in copied:
                        dict.__setitem__(container, k, copied[k])
                    else:
                        dict.__delitem__(container, k)


_LEAVES = frozenset({type(None), bool, int, float, str, bytes, torch.Tensor})


def _contents(v: Any) -> tuple[Any, str] | None:
    """The container of ``v``'s items and how they are stored, or None (nothing to put back:
    a tensor, a module (its attributes are read, and noted, on their own), a library's
    object)."""
    if isinstance(v, list):
        return v, "list"
    if isinstance(v, dict):
        return v, "item"
    if isinstance(v, (torch.Tensor, nn.Module, type)) or not _is_value_object(v, type(v)):
        return None
    namespace = getattr(v, "__dict__", None)
    return (namespace, "attr") if type(namespace) is dict else None


def _differ(items: list[Any], copied: list[Any]) -> bool:
    now = list.copy(items)
    return len(now) != len(copied) or any(a is not b for a, b in zip(now, copied))


def holds_tracer(v: Any) -> bool:
    """Whether ``v``, or anything it holds, is a tensor of the capture."""
    return holds_made(v, _is_tracer)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)

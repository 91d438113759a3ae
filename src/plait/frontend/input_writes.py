"""What a program does to the mutable containers of its inputs, and doing it again on each call.

Capture calls the program on rebuilt inputs (:func:`plait.frontend.pytree.unflatten`): each
list, plain dict and opened object (a plain object that ``copy.copy`` rebuilds from its
attributes: Hugging Face's ``DynamicCache`` and its layers) the program gets is capture's own,
standing for the caller's. The program may rebind an attribute (``layer.keys =
torch.cat(...)``), append to a list, set a flag. :class:`InputObjects` records those
containers, what each held when the program started and, after it, which changed: their final
contents become part of the program's result, flattened with every container of the call kept
as a reference to itself, and each call puts them back into the caller's own containers
(:func:`write_back`), as eager's in-place changes would. A result that is such a container
(``out.past_key_values is past``) is the caller's, never capture's.

NOTE: a container whose contents the program did not change is never written: a call that
passes a list pays nothing for it.

Example:
    >>> from plait.frontend import pytree
    >>> objects = InputObjects()
    >>> built = pytree.unflatten(("list", 1, (pytree.LEAF,)), [1], objects.made)
    >>> objects.started([])
    >>> built.append(2)
    >>> objects.changed(), objects.finals()
    ([0], ([1, 2],))
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from plait.errors import InternalValueError, PlaitError


def _contents(c: Any) -> tuple[Any, ...]:
    """What a container holds, flat: a list's items, a dict's (or an object's) keys and values."""
    if isinstance(c, list):
        return tuple(c)
    pairs = c.items() if isinstance(c, dict) else _attributes(c).items()
    return tuple(x for pair in pairs for x in pair)


def _attributes(x: Any) -> dict[str, Any]:
    """An object's own attributes (its ``__dict__`` and slots); none for tensors, modules and
    values (NOTE: tensors and modules have their own write rules)."""
    if isinstance(x, (torch.Tensor, nn.Module, type)) or not hasattr(type(x), "__mro__"):
        return {}
    out = dict(getattr(x, "__dict__", {}))
    for cls in type(x).__mro__:
        slots = vars(cls).get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(x, name):
                out[name] = getattr(x, name)
    return out


_VALUES = (str, bytes, int, float, complex, bool, type(None), type, torch.dtype, torch.device)


def _state(x: Any) -> Any:
    """What ``x`` holds that a program could change in place, shallow (None: nothing)."""
    if isinstance(x, (list, bytearray)):
        return ("items", tuple(x), _attributes(x))
    if isinstance(x, dict):
        return ("items", tuple(x.items()), _attributes(x))
    if isinstance(x, set):
        return ("set", {id(v): v for v in x}, _attributes(x))
    if type(x).__module__ == "numpy" and hasattr(x, "tobytes") and hasattr(x, "copy"):
        return ("array", x.copy(), None)
    attrs = _attributes(x)
    return ("attrs", None, attrs) if attrs else None


def _same_state(a: Any, b: Any) -> bool:
    if a is None or b is None or a[0] != b[0]:
        return a is b
    if a[0] == "array":
        return bool(a[1].shape == b[1].shape and a[1].tobytes() == b[1].tobytes())
    if a[0] == "set":
        if a[1].keys() != b[1].keys():
            return False
    elif a[1] is not None and not _same(a[1], b[1]):
        return False
    ka, kb = a[2] or {}, b[2] or {}
    return ka.keys() == kb.keys() and all(ka[k] is kb[k] for k in ka)


def _snapshot(leaves: list[Any], depth: int = 8) -> list[tuple[Any, Any]]:
    """The state of every object reachable from the call's leaves (NOTE: tensors and modules
    have their own write rules, values are immutable)."""
    out: list[tuple[Any, Any]] = []
    seen: set[int] = set()
    todo = [(x, depth) for x in leaves]
    while todo:
        x, left = todo.pop()
        if left == 0 or isinstance(x, (torch.Tensor, nn.Module, *_VALUES)) or id(x) in seen:
            continue
        seen.add(id(x))
        state = _state(x)
        if state is None:
            continue
        out.append((x, state))
        kids: list[Any] = list((state[2] or {}).values())
        if state[0] == "items":
            kids += [v for item in state[1] for v in (item if isinstance(x, dict) else (item,))]
        elif state[0] == "set":
            kids += list(state[1].values())
        todo += [(k, left - 1) for k in kids]
    return out


def _put_back(x: Any, was: Any) -> None:
    kind, items, attrs = was
    if kind == "array":
        x[...] = items
        return
    if isinstance(x, dict):
        x.clear()
        x.update(items)
    elif isinstance(x, (list, bytearray)):
        x[:] = items
    elif isinstance(x, set):
        x.clear()
        x.update(items.values())
    for name in set(_attributes(x)) - set(attrs or {}):
        object.__delattr__(x, name)
    for name, value in (attrs or {}).items():
        object.__setattr__(x, name, value)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The same contents, item by item, by identity (NOTE: a key set again to an equal value
    counts as a change: the write back is then only redundant)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class InputObjects:
    """The containers capture built for one call of the program (see the module doc)."""

    def __init__(self) -> None:
        self.made: list[Any] = []  # filled by unflatten, in the order pytree.containers walks
        self._before: list[tuple[Any, ...]] = []
        self.index: dict[int, int] = {}
        self._kept: list[tuple[Any, Any]] = []

    def started(self, leaves: list[Any]) -> None:
        """The program is about to run on the containers built and on the call's other leaves
        (``leaves``: objects passed as they are among them): note what each holds."""
        self._before = [_contents(c) for c in self.made]
        self.index = {id(c): k for k, c in enumerate(self.made)}
        self._kept = _snapshot(leaves)

    def leaf_changed(self) -> str | None:
        """What the program changed in place in an object the call passed as it is (a set, a
        list subclass, a numpy array, a slotted object's counter, what such an object holds):
        capture changed the caller's own once, a compiled call would never do it again."""
        for x, was in self._kept:
            if not _same_state(was, _state(x)):
                return f"a {type(x).__qualname__}"
        return None

    def raised_after_changes(self, exc: BaseException) -> str | None:
        """The program raised ``exc`` (its own error, not capture's) after changing an input
        container or object in place: eager leaves those changes in the caller's objects, a
        capture left them in its own (the call then runs eagerly, as it would uncompiled)."""
        if not isinstance(exc, Exception) or isinstance(exc, PlaitError) or not self._before:
            return None
        if not self.changed() and self.leaf_changed() is None:
            return None
        return (
            f"the program raised {type(exc).__name__} after changing its input containers in "
            "place: eager leaves those changes in the caller's objects"
        )

    @staticmethod
    def raised_after_writes(exc: BaseException, written: Iterable[Any]) -> str | None:
        """The program raised ``exc`` (its own error) after writing in place a tensor of the
        call, a buffer or a constant (``written``: the lifts of the roots it wrote): eager
        leaves those writes in the caller's tensors, a capture left them in its clones (the call
        then runs eagerly, as it would uncompiled)."""
        if not isinstance(exc, Exception) or isinstance(exc, PlaitError):
            return None
        names = [lift.name for lift in written if lift is not None and lift.writeback]
        if not names:
            return None
        return (
            f"the program raised {type(exc).__name__} after writing {names[0]} in place: eager "
            "leaves the write in the caller's tensor"
        )

    def restore_leaves(self) -> None:
        """Put back what the objects the call passed as they are held (a refused or restarted
        capture must not leave its changes, or its tensors, in the caller's objects)."""
        for x, was in self._kept:
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                _put_back(x, was)

    def is_input(self, x: Any) -> bool:
        return id(x) in self.index

    def changed(self) -> list[int]:
        """The containers whose contents the program changed, by position."""
        return [
            k
            for k, (c, was) in enumerate(zip(self.made, self._before))
            if not _same(was, _contents(c))
        ]

    def unwritable(self, changed: list[int]) -> str | None:
        """A changed container that is not written back: a dataclass (``__init__`` rebuilds
        it; its fields may be frozen, slotted or also a dict's, as ``ModelOutput``'s)."""
        for k in changed:
            c = self.made[k]
            if dataclasses.is_dataclass(c):
                return f"a {type(c).__qualname__} (a dataclass)"
        return None

    def finals(self, changed: list[int] | None = None) -> tuple[Any, ...]:
        """The final contents of the ``changed`` containers: an object's as a dict of its
        attributes, a list's as a list, a dict's as a dict."""
        out: list[Any] = []
        for k in self.changed() if changed is None else changed:
            c = self.made[k]
            out.append(
                list(c) if isinstance(c, list) else dict(c if isinstance(c, dict) else vars(c))
            )
        return tuple(out)


def write_back(objects: list[Any], written: list[int], finals: tuple[Any, ...]) -> None:
    """Give each written container of the caller's (``objects[k]``) its final contents."""
    if len(written) != len(finals):
        raise InternalValueError("write_back: a final state per written container")
    for k, final in zip(written, finals):
        c = objects[k]
        if isinstance(c, list):
            c[:] = final
        elif isinstance(c, dict):
            c.clear()
            c.update(final)
        else:
            state = vars(c)
            state.clear()
            state.update(final)

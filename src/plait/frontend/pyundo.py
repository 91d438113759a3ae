"""The Python values a capture read, as they were when it first read them, put back when the
capture does not stand (:class:`Originals`).

A capture runs the program's Python for real. When it falls back (a read of tensor data, a
value the program changes while it runs) or starts again, the program's Python runs once more
(eagerly, or in the next attempt): a value the capture read and changed (``self.calls += 1``,
``global STEP; STEP += 1``, ``self.seen.append(n)``) would be changed twice by one call. Each
module attribute and global the capture read is noted at its first read: the binding, and the
contents of a plain list, dict or set (a shallow copy); :meth:`Originals.restore` rebinds what
was rebound and refills a container changed in place. Values nested deeper, and writes to
places the program never read, are not put back.

Example:
    >>> ns = {"calls": 0, "seen": [1]}
    >>> undo = Originals()
    >>> undo.note(ns, "calls"); undo.note(ns, "seen")
    >>> ns["calls"] += 1; ns["seen"].append(2)
    >>> undo.restore(); ns
    {'calls': 0, 'seen': [1]}
"""

from __future__ import annotations

from typing import Any

_ABSENT = object()
_CONTAINERS = (list, dict, set)


class Originals:
    """Bindings (and shallow contents of plain containers) as first read, in reading order."""

    def __init__(self) -> None:
        self._noted: list[tuple[dict, str, Any, Any]] = []
        self._seen: set[tuple[int, str]] = set()

    def note(self, namespace: dict, name: str) -> None:
        """``namespace[name]`` as it is now (a first read: later ones are ignored)."""
        if (id(namespace), name) in self._seen:
            return
        self._seen.add((id(namespace), name))
        value = namespace.get(name, _ABSENT)
        contents = value.copy() if type(value) in _CONTAINERS else None
        self._noted.append((namespace, name, value, contents))

    def restore(self) -> None:
        """Each noted binding as first read, its container's items refilled where changed."""
        for namespace, name, value, contents in reversed(self._noted):
            if namespace.get(name, _ABSENT) is not value:
                if value is _ABSENT:
                    namespace.pop(name, None)
                else:
                    namespace[name] = value
            if contents is not None and _changed(value, contents):
                value.clear()
                if type(value) is list:
                    value.extend(contents)
                else:
                    value.update(contents)


def _changed(value: Any, contents: Any) -> bool:
    """Whether a container's items differ from its copy (by identity: items may be tensors)."""
    if len(value) != len(contents):
        return True
    if type(value) is list:
        return any(a is not b for a, b in zip(value, contents))
    if type(value) is dict:
        return list(value) != list(contents) or any(value[k] is not contents[k] for k in contents)
    return any(item not in contents for item in value)

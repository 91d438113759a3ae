"""Python values the program read and then stored a traced tensor in, put back when its capture
ends without a program.

A program may memoize a tensor in a container it reads (timm's LeViT and EfficientFormer fill
``self.attention_bias_cache[device]`` on their first eval call). Capture refuses a program that
changes a value it reads (:mod:`plait.frontend.pyreads`), or starts again, and the call runs
eagerly; by then the capture's run has stored one of its tracers there. The eager run, a capture
tried again and every later call would find that tracer and read the capture's value, which
:func:`plait.frontend.capture_values._refuse_kept` refuses: every call of the model raised.
:class:`Originals` keeps each module attribute and global as the program first read it (the
binding, and a shallow copy of a list or dict), and :meth:`Originals.restore` puts back those
that now hold a tracer they did not hold, so the eager run fills the memo itself, as eager does.

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

from collections.abc import MutableMapping
from typing import Any

from plait.frontend.capture_values import Tracer
from plait.frontend.pyvalues import ABSENT
from plait.frontend.state import holds_made


class Originals:
    """Module attributes and globals as the program first read them."""

    def __init__(self) -> None:
        # NOTE: (namespace, name, value read, a shallow copy of a list's or dict's items or None)
        self._seen: dict[tuple[int, str], tuple[MutableMapping[str, Any], str, Any, Any]] = {}

    def note(self, namespace: MutableMapping[str, Any], name: str, value: Any) -> None:
        """``namespace[name]`` was first read as ``value`` (``ABSENT``: not there)."""
        key = (id(namespace), name)
        if key not in self._seen:
            copied = value.copy() if type(value) in (list, dict) else None
            self._seen[key] = (namespace, name, value, copied)

    def restore(self) -> None:
        """Puts back each binding that now holds a tracer, and the items of each list or dict
        read that now holds one it did not."""
        for namespace, name, value, copied in self._seen.values():
            now = namespace.get(name, ABSENT)
            if now is not value and _holds_tracer(now):
                if value is ABSENT:
                    namespace.pop(name, None)
                else:
                    namespace[name] = value
            if copied is None or not _holds_tracer(value):
                continue
            if type(value) is dict:
                value.clear()
                value.update(copied)
            else:
                value[:] = copied


def _holds_tracer(v: Any) -> bool:
    return holds_made(v, _is_tracer)


def _is_tracer(x: Any) -> bool:
    return isinstance(x, Tracer)

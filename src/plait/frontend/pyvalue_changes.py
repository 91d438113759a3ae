"""Where two value keys of a Python value differ, and how a value key shows in a recompile
reason (:mod:`plait.frontend.pyvalues` makes the keys: plain values by ``(type, value)``, floats
by ``(type, "bits", ...)``, containers and user objects by their items).

Example:
    >>> changed_at(((str, "a"), (float, "bits", 0)), ((str, "a"), (float, "bits", 1)), "cfg")
    ('cfg', (<class 'float'>, 'bits', 0), (<class 'float'>, 'bits', 1))
    >>> short((float, "bits", 4611686018427387904))
    '2.0'
"""

from __future__ import annotations

import struct
from typing import Any


def _plain(key: Any) -> bool:
    """A value key of a plain value: ``(type, value)`` or ``(type, "bits", ...)``."""
    return (
        isinstance(key, tuple)
        and len(key) >= 2
        and isinstance(key[0], type)
        and (key[1] == "bits" or not isinstance(key[1], tuple))
    )


def changed_at(a: Any, b: Any, where: str) -> tuple[str, Any, Any]:
    """The first place two value keys differ (``self.config.n_embd``) and the two values."""
    while (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b)
        and not _plain(a)
        and not _plain(b)
    ):
        i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
        x, y = a[i], b[i]
        if (
            isinstance(x, tuple)
            and isinstance(y, tuple)
            and len(x) == len(y) == 2
            and x[0] == y[0]
            and not _plain(x)
        ):
            name = x[0]
            if isinstance(name, str):
                where += f".{name}"
            elif _plain(name):
                where += f"[{name[1]!r}]"
            a, b = x[1], y[1]
            continue
        a, b = x, y
    return where, a, b


def short(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 3 and key[1] == "bits":
        return repr(struct.unpack("<d", struct.pack("<q", key[2]))[0])
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], type):
        text = repr(key[1])
    else:
        text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."

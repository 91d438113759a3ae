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

Example:
    >>> import numpy as np
    >>> a = np.arange(3.0)
    >>> before = array_key(a)
    >>> a[0] = 5.0
    >>> array_key(a) == before
    False
"""

from __future__ import annotations

import hashlib
import io
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from plait.errors import GraphCaptureError

INLINE_BYTES = 1 << 16  # NOTE: an array's bytes kept as they are up to this; a digest past it


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

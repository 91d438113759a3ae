"""``Tensor.set_`` during capture: refused where it involves a traced tensor.

PyTorch runs ``Tensor.set_`` without a torch function (no ``__torch_function__``, no mode), so
capture never sees it: ``x.set_(y)`` on an input gave the tracer ``y``'s memory and shape behind
capture's back (the graph then read ``x``'s old value, and the caller's ``x`` kept its own), and
``G.set_(y)`` on a global made the global share a capture sample's memory once, never again on
a compiled call. While a capture runs, :func:`refusing_set` puts a ``Tensor.set_`` in place that
refuses a call on the capturing thread whose tensor or arguments are traced (a
``GraphCaptureError`` of kind ``limitation``: the eager fallback) and is PyTorch's own otherwise
(other threads: a DataLoader's pin-memory thread rebuilds tensors with ``set_``).

Example:
    >>> import torch
    >>> torch.Tensor.set_ is _ORIGINAL
    True
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from plait.frontend.capture_values import Tracer

if TYPE_CHECKING:
    from plait.frontend.capture_values import CaptureValues

_ORIGINAL = torch.Tensor.set_
_LOCK = threading.Lock()
_USERS = [0]
_LOCAL = threading.local()


def _set(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    cx = getattr(_LOCAL, "cx", None)
    if cx is not None and cx.continued:  # NOTE: the call goes on eagerly, on the samples
        from plait.frontend.continuation import plain

        return _ORIGINAL(plain(self), *plain(args), **plain(kwargs))
    if cx is not None and any(isinstance(a, Tracer) for a in (self, *args, *kwargs.values())):
        cx.current = "Tensor.set_"
        cx.limitation(
            "Tensor.set_ gives a tensor other memory and another shape; PyTorch runs it "
            "without a torch function, so a captured graph cannot hold it"
        )
    return _ORIGINAL(self, *args, **kwargs)


@contextmanager
def refusing_set(cx: CaptureValues) -> Iterator[None]:
    """``Tensor.set_`` refused on this thread while ``cx`` captures (see the module doc)."""
    prev = getattr(_LOCAL, "cx", None)
    with _LOCK:
        _USERS[0] += 1
        if _USERS[0] == 1:
            torch.Tensor.set_ = _set  # type: ignore[method-assign,assignment]
    _LOCAL.cx = cx
    try:
        yield
    finally:
        _LOCAL.cx = prev
        with _LOCK:
            _USERS[0] -= 1
            if _USERS[0] == 0:
                torch.Tensor.set_ = _ORIGINAL  # type: ignore[method-assign]

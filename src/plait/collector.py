"""Python's cyclic garbage collector, paused while plait captures and compiles.

A compile makes many short-lived objects; each full collection it triggers walks the whole
heap, and in a process that has loaded PyTorch and a model library that costs 0.1-0.25 s per
compile (measured on the zoo's transformers and ResNet-50). The collector is paused from the
start of a capture to the end of its compile and resumed after, where it collects what the
compile left. Pauses nest and may overlap across threads: the collector resumes when the last
one ends, and only when it was running before the first began (a program that turned it off
keeps it off).

Example:
    >>> import gc
    >>> with collector_paused():
    ...     gc.isenabled()
    False
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_DEPTH = 0
_WAS_ENABLED = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block (see the module doc)."""
    global _DEPTH, _WAS_ENABLED
    with _LOCK:
        if _DEPTH == 0:
            _WAS_ENABLED = gc.isenabled()
            gc.disable()
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _WAS_ENABLED:
                gc.enable()

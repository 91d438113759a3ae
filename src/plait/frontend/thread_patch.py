"""A library function replaced while captures run, answering for the capturing threads only.

``owner.name`` is our function while any thread is inside :meth:`ThreadPatch.on`, and the
library's again once none is; our function asks :meth:`ThreadPatch.active` whether the calling
thread is capturing and otherwise calls :meth:`ThreadPatch.original`. The function replaced is
kept after it is put back: a thread that looked ours up just before may call it after.

Example:
    >>> import types
    >>> lib = types.SimpleNamespace(flag=lambda: False)
    >>> patch = ThreadPatch(lib, "flag", lambda: patch.active() or patch.original())
    >>> with patch.on():
    ...     lib.flag()
    True
    >>> lib.flag()
    False
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class ThreadPatch:
    """``owner.name`` replaced by ``replacement`` while threads are inside :meth:`on`."""

    def __init__(self, owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        self.owner, self.name, self.replacement = owner, name, replacement
        self._lock = threading.Lock()
        self._depth: dict[int, int] = {}  # NOTE: thread id -> depth of the blocks it is in
        self._replaced: list[Callable[..., Any]] = [getattr(owner, name)]

    def active(self) -> bool:
        """Whether the calling thread is inside :meth:`on`."""
        return threading.get_ident() in self._depth

    def original(self, *args: Any, **kwargs: Any) -> Any:
        """The library's function, called."""
        return self._replaced[0](*args, **kwargs)

    @contextmanager
    def on(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._lock:
            current = getattr(self.owner, self.name)
            if not self._depth and current is not self.replacement:
                self._replaced[0] = current
                setattr(self.owner, self.name, self.replacement)
            self._depth[me] = self._depth.get(me, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._depth[me] -= 1
                if not self._depth[me]:
                    del self._depth[me]
                if not self._depth:
                    setattr(self.owner, self.name, self._replaced[0])

"""A deferred hash check held open while the entry is rebuilt, by handshake rather than a sleep.

``hold(pending)`` wraps a :class:`~plait.cache.store.Pending`: a thread other than the one
loading the entry (a reorder job's) that asks for the check waits until the loader itself asks
for it (the rebuild waits for it: a probe, the C++ compiler, the wait after the rebuild) or its
rebuild has returned. So whatever reads the entry natively without waiting for its check does
so while the check is still pending, however the threads are scheduled, and a correct rebuild
cannot deadlock on the hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from plait.cache import compiled
from plait.cache.store import Pending

# NOTE: far longer than any rebuild here; reached only where the handshake never comes
_DEADLOCK_S = 120.0


class HeldChecks:
    """Installed by :func:`held_checks`; ``hold(pending)`` from inside a ``get_pending`` spy."""

    def __init__(self) -> None:
        self._released: dict[int, threading.Event] = {}
        self.stuck: list[str] = []  # NOTE: threads whose check waited past the bound

    def hold(self, pending: Pending) -> Pending:
        loader = threading.get_ident()
        released = self._released[loader] = threading.Event()
        check, verified = pending.check, pending.verified

        def held() -> Any:
            if threading.get_ident() != loader and not released.wait(_DEADLOCK_S):
                self.stuck.append(threading.current_thread().name)
            return check()

        def asked() -> memoryview:
            if threading.get_ident() == loader:
                released.set()  # NOTE: before the lock, which a held thread may have
            return verified()

        pending.check = held
        pending.verified = asked  # type: ignore[method-assign]
        return pending

    def _rebuild(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def rebuild(*args: Any, **kwargs: Any) -> Any:
            try:
                return real(*args, **kwargs)
            finally:
                event = self._released.get(threading.get_ident())
                if event is not None:
                    event.set()

        return rebuild


def held_checks(monkeypatch: pytest.MonkeyPatch) -> HeldChecks:
    """Spy on the rebuild of cache entries so that ``hold`` also knows when it has returned."""
    held = HeldChecks()
    monkeypatch.setattr(compiled, "_rebuild_stax", held._rebuild(compiled._rebuild_stax))
    return held

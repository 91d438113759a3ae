"""The two copies :class:`plait.cache.remote.TieredStore` makes of an entry read from the remote
tier: the caller's private writable buffer (:func:`aligned_copy`), and the local store's copy,
written on a thread once the call the entry served has returned (:func:`defer_copy`,
:func:`start_copies`; :func:`settle` waits for them all). ``plait.cache.remote`` re-exports
:func:`start_copies` and :func:`settle`.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from plait.cache.lookup import CacheWarning
from plait.cache.store import LocalStore

# NOTE: the local copies of remote entries being written, by (local root, key): a read of the
# same entry waits for its copy; the threads are not daemons (an exit waits for them)
_COPIES: dict[tuple[str, str], threading.Thread] = {}
_COPIES_LOCK = threading.Lock()
# NOTE: copies not yet started: a copy starts once the call its entry serves has returned
# (start_copies), so that its write and hash take no CPU from that call's build and first run;
# a read of the entry, settle() and the interpreter's exit start (and wait for) it sooner
_DEFERRED: list[threading.Thread] = []


def aligned_copy(payload: memoryview) -> memoryview:
    """A private writable copy of ``payload`` starting at a 64-byte boundary (torch's
    allocator): an artifact's blobs sit at 64-byte offsets and are built in place only in
    memory aligned so (in a bytearray, 16-byte aligned, each was copied once more)."""
    import torch

    out = torch.empty(payload.nbytes, dtype=torch.uint8).numpy().data.cast("B")
    out[:] = payload.cast("B") if payload.format != "B" else payload
    return out


def defer_copy(local: LocalStore, key: str, payload: memoryview, meta: dict[str, Any]) -> None:
    """Put ``payload`` into ``local`` under ``key`` on a thread that :func:`start_copies`
    starts (a read of the entry, :func:`settle` or the interpreter's exit start it sooner)."""
    copy = threading.Thread(
        target=_keep_locally,
        args=(local, key, payload, meta),
        name=f"plait-cache-copy-{key[:8]}",
    )
    with _COPIES_LOCK:
        _COPIES[(str(local.root), key)] = copy
        _DEFERRED.append(copy)


def start_copies() -> None:
    """Start writing the local copies of the remote entries fetched so far (the API calls it
    when the call that fetched them has returned)."""
    # NOTE: taken off the list and started under the lock: a reader never finds a copy that is
    # neither deferred nor started (it would join a thread not yet started)
    with _COPIES_LOCK:
        for thread in _DEFERRED:
            thread.start()
        _DEFERRED.clear()


def _started(thread: threading.Thread) -> threading.Thread:
    with _COPIES_LOCK:
        if thread in _DEFERRED:
            _DEFERRED.remove(thread)
            thread.start()
    return thread


def wait_for_copy(root: str, key: str) -> None:
    """Wait until the local copy of ``key`` into the store at ``root`` is written, if one is
    deferred (started now) or being written."""
    with _COPIES_LOCK:
        thread = _COPIES.get((root, key))
    if thread is not None:
        _started(thread).join()


def superseded(root: str, key: str) -> None:
    """A copy of ``key`` into the local store at ``root`` that has not started is dropped, one
    that runs is waited for: the caller is about to write or delete that entry itself (a
    rebuilt entry replacing a remote one that did not load), and must be the last to."""
    with _COPIES_LOCK:
        thread = _COPIES.get((root, key))
        if thread is not None and thread in _DEFERRED:
            _DEFERRED.remove(thread)
            del _COPIES[(root, key)]
            return
    if thread is not None:
        thread.join()


# NOTE: before the interpreter joins its threads (concurrent.futures's hook; plain atexit runs
# after that join, too late to start a thread)
getattr(threading, "_register_atexit", lambda fn: None)(start_copies)


def _keep_locally(local: LocalStore, key: str, payload: memoryview, meta: dict[str, Any]) -> None:
    try:
        local.put(key, payload, meta)
    except (OSError, ValueError) as exc:  # NOTE: the call has its entry; only the copy is lost
        warnings.warn(
            f"plait cache: the local copy of remote entry {key[:16]}… was not kept: {exc}",
            CacheWarning,
            stacklevel=1,
        )
    finally:
        with _COPIES_LOCK:
            _COPIES.pop((str(local.root), key), None)


def settle() -> None:
    """Wait until the local copies of remote entries this process is writing are written."""
    start_copies()
    with _COPIES_LOCK:
        copies = list(_COPIES.values())
    for thread in copies:
        thread.join()

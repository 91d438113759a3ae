"""plait.cache: the content-addressed artifact cache (L6).

A compiled specialization is saved under a key made of everything that decided it (source
semantic hash, guards, target, options, toolchain, ambient settings, frozen weights) and loaded
by a later process that captures the same program under the same conditions: a warm start skips
the passes, the planner's dry runs and the C++ compiler.

The default store is a directory: ``$PLAIT_CACHE_DIR/artifacts`` when that variable is set, else
``$XDG_CACHE_HOME/plait/artifacts`` (``~/.cache/plait/artifacts``); ``plait.compile(...,
options={"cache": ...})`` takes ``False`` (off), a directory, a ``redis://`` URL, or a
:class:`Store`. ``$PLAIT_CACHE_URL`` (or a ``redis://`` URL as the option) puts a shared remote
tier behind the local directory (:mod:`plait.cache.remote`).

Example:
    >>> import tempfile
    >>> store = resolve_store(tempfile.mkdtemp())
    >>> isinstance(store, LocalStore), store.stat().entries
    (True, 0)
    >>> resolve_store(False) is None
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from plait.cache.compiled import SavedCompile, StaleEntryError, load_compiled, save_compiled
from plait.cache.key import CacheKey, MissExplanation, explain_miss
from plait.cache.store import (
    CorruptEntryError,
    EntryInfo,
    LocalStore,
    Store,
    StoreStats,
    VerifyReport,
    max_bytes_setting,
)
from plait.errors import InvalidOptionError


def cache_root() -> Path:
    """The per-user cache directory (``$PLAIT_CACHE_DIR``, else the XDG cache home)."""
    env = os.environ.get("PLAIT_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "plait"


def default_store() -> LocalStore:
    return LocalStore(cache_root() / "artifacts")


# NOTE: the setting that names a remote tier (plait.cache.remote reads it)
REMOTE_URL_VARIABLE = "PLAIT_CACHE_URL"


def _remote_url(option: Any) -> str | None:
    """The remote tier an option (or else ``$PLAIT_CACHE_URL``) names for a local store."""
    if not (isinstance(option, str) and "://" in option) and not os.environ.get(
        REMOTE_URL_VARIABLE
    ):
        return None  # NOTE: none named: the remote tier's module (and redis) stay unloaded
    from plait.cache import remote

    return option if remote.is_remote_url(option) else remote.url_setting()


def check_store_option(option: Any) -> None:
    """Raise ``ValueError`` for an ``options['cache']`` value :func:`resolve_store` refuses
    (without opening any store or contacting any server; ``ImportError`` when a remote tier is
    named and the ``redis`` client library is missing)."""
    if option is False or isinstance(option, Store):
        return
    if option is None or isinstance(option, (bool, str, os.PathLike)):
        max_bytes_setting()  # NOTE: a local store reads it: a bad value fails here, too
        url = _remote_url(option)
        if url is not None:
            from plait.cache import remote

            remote.check_url(url)
        return
    raise InvalidOptionError(
        f"options['cache'] must be True, False, a directory, a redis:// URL or a "
        f"plait.cache.Store, got {type(option).__name__}"
    )


def resolve_store(option: Any = True) -> Store | None:
    """The store an option names: ``True``/``None`` the default, ``False`` none, a path a
    :class:`LocalStore` there, a :class:`Store` itself; a ``redis://`` URL (or, for the first
    three, ``$PLAIT_CACHE_URL``) adds a remote tier behind the local one."""
    check_store_option(option)
    if option is False:
        return None
    if isinstance(option, Store):
        return option
    url = _remote_url(option)
    if option is None or option is True or url == option:
        local = default_store()
    else:
        local = LocalStore(option)
    if url is None:
        return local
    from plait.cache import remote

    return remote.TieredStore(local, remote.remote_store(url))


__all__ = [
    "CacheKey",
    "CorruptEntryError",
    "EntryInfo",
    "LocalStore",
    "MissExplanation",
    "SavedCompile",
    "StaleEntryError",
    "Store",
    "StoreStats",
    "VerifyReport",
    "cache_root",
    "check_store_option",
    "default_store",
    "explain_miss",
    "load_compiled",
    "resolve_store",
    "save_compiled",
]

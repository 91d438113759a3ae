"""The artifact store: an interface, and the local on-disk store plait uses by default.

A store maps a key (the hex SHA-256 of a :class:`~plait.cache.key.CacheKey`) to one entry: a JSON
``meta`` document (the key's parts, what the artifact is) and an opaque ``payload``. Every entry
carries the (chunked) XXH3-128 hash of its own bytes and is checked against it on every read: a
corrupt, truncated or unreadable entry raises :class:`CorruptEntryError` after it was removed,
so the caller rebuilds it and says so; it is never used. An entry of another format (format 1
carried a SHA-256, format 2 a BLAKE3, format 3 one XXH3 stream) is never read with this
format's rules: it is discarded the same way and rebuilt.

The self-hash detects accidents (a flipped bit, a truncated or torn file), which is all it can
do: whoever can write an entry can also write its hash, so a cryptographic hash would buy no
protection here, and XXH3 reads memory about as fast as the machine delivers it (45 MB in about
2 ms on one core, against 11 ms for BLAKE3; every warm start verifies its whole entry), in
chunks on several threads (:mod:`plait.ir.chunked_hash`).

:class:`LocalStore` lays entries out as ``objects/<key[:2]>/<key>``, publishes each one atomically
(written to a temporary file, fsynced, then ``os.replace``), and keeps an index (sizes, last
access, key parts) under a file lock. The index is a cache of the objects, never their authority:
an unreadable index is rebuilt from the objects. Entries past the size limit go least recently
used first.

:meth:`Store.get_buffer` is the zero-copy read: :class:`LocalStore` maps the entry's file
copy-on-write (``MAP_PRIVATE``), verifies the hash over the mapping and returns the payload as a
writable view of it, on which the caller builds tensors without copying (a write to them stays in
this process and never reaches the file). plait only ever replaces (``os.replace``) or unlinks an
entry, never writes into one, so a mapped entry never changes under its reader (the mapping holds
the inode it opened); a process that writes into an entry's file in place is outside what the
store guarantees.

Example:
    >>> import tempfile
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> store.put("ab" * 32, b"payload", {"parts": {"source": "x"}})
    >>> store.get("ab" * 32)
    b'payload'
    >>> store.stat().entries, store.verify().ok
    (1, True)
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from plait.cache.entry_file import (
    HEADER,
    Payload,
    check_key,
    encode_entry,
    frame,
    hash_error,
    map_entry,
    open_mapping,
    read_head,
)
from plait.codegen import native_hash
from plait.errors import InvalidOptionError, StoreFormatError
from plait.ir.private_files import FILE_MODE, private_dir, private_subdir, staged_file

DEFAULT_MAX_BYTES = 8 << 30
# NOTE: seconds a writer waits for index.lock: a holder that is stopped (Ctrl-Z, a debugger,
# SIGSTOP) or hung must cost the index update, never hang every compile that writes the cache
INDEX_LOCK_TIMEOUT = 10.0
INDEX_SCHEMA = "plait.cache.index/1"


def max_bytes_setting() -> int:
    """``$PLAIT_CACHE_MAX_BYTES`` (default 8 GiB); raises ``ValueError`` naming the variable
    when it is not a whole number of bytes."""
    env = os.environ.get("PLAIT_CACHE_MAX_BYTES")
    if not env:
        return DEFAULT_MAX_BYTES
    try:
        return int(env)
    except ValueError:
        raise InvalidOptionError(
            f"PLAIT_CACHE_MAX_BYTES must be a whole number of bytes, got {env!r}"
        ) from None


class IndexLockTimeout(TimeoutError):
    """Another process held a store's index lock past :data:`INDEX_LOCK_TIMEOUT` (a stopped
    or hung process): an ``OSError``, which the store's callers treat as a cache they cannot
    update (the compile goes on uncached)."""


class CorruptEntryError(Exception):
    """An entry failed its own hash (or could not be read); it was removed from the store."""

    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason
        super().__init__(f"cache entry {key[:16]}… discarded: {reason}")


@dataclass
class EntryInfo:
    """One entry as the index knows it: key, size, last access, the small items of its meta."""

    key: str
    size: int
    last_access: float
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class StoreStats:
    location: str
    entries: int
    bytes: int
    max_bytes: int

    def __str__(self) -> str:
        return (
            f"{self.location}: {self.entries} entries, {_size(self.bytes)} "
            f"(limit {_size(self.max_bytes)})"
        )


@dataclass
class VerifyReport:
    checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        head = f"checked {self.checked} entries: " + ("ok" if self.ok else "problems found")
        return "\n".join([head, *(f"  - {p}" for p in self.problems)])


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class Store(abc.ABC):
    """What plait needs of an artifact store (a remote shared store implements the same)."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """The payload, verified; None when absent. Raises :class:`CorruptEntryError` (after
        removing the entry) when the stored bytes fail their hash."""

    def get_buffer(self, key: str) -> memoryview | None:
        """The payload, verified, as a writable buffer the caller may build tensors on without
        copying (writes stay private to this process); None when absent. Raises
        :class:`CorruptEntryError` like :meth:`get`. This default copies what :meth:`get`
        returns; :class:`LocalStore` maps the file instead."""
        data = self.get(key)
        return None if data is None else memoryview(bytearray(data))

    def get_pending(self, key: str) -> Pending | None:
        """Like :meth:`get_buffer`, with the hash check deferred to :meth:`Pending.verified`
        where the store can (:class:`LocalStore`: the hash is computed in the background while
        the caller parses); this default verifies first."""
        payload = self.get_buffer(key)
        return None if payload is None else Pending(payload)

    def read_ahead(self, key: str) -> None:
        """A hint: ``key`` is likely to be read soon (:class:`LocalStore` starts checking its
        hash in the background; a later :meth:`get_pending` of it takes that read over, with
        whatever it found). This default does nothing."""
        return None

    @abc.abstractmethod
    def put(self, key: str, payload: Payload, meta: dict[str, Any]) -> None:
        """Publish an entry atomically: readers see the old entry, the new one, or none.
        ``payload``: bytes, or buffers that make it up, in order."""

    @abc.abstractmethod
    def read_meta(self, key: str) -> dict[str, Any] | None:
        """An entry's full meta (its key parts), None when absent or unreadable: for
        explanations of misses, never for loading."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self) -> list[EntryInfo]: ...

    @abc.abstractmethod
    def stat(self) -> StoreStats: ...

    @abc.abstractmethod
    def verify(self) -> VerifyReport:
        """Check every entry against its hash; remove those that fail and report them."""

    def clear(self) -> int:
        """Remove every entry; returns how many."""
        keys = [e.key for e in self.list()]
        return sum(self.delete(k) for k in keys)

    def take_notes(self) -> Sequence[str]:
        """What the store did since the last call that the caller's manifest should say (a
        remote tier's reads, publishes and outages: :class:`plait.cache.remote.TieredStore`);
        each note is handed out once. This default has none."""
        return []

    def served_by(self, key: str) -> str | None:
        """Which tier served ``key``'s last read (``"local"``, ``"remote"``), for a store with
        tiers; None for a store of one."""
        return None


@dataclass
class Pending:
    """A payload read before its hash is checked: :attr:`payload` may be parsed (by code that
    cannot crash on garbage: Python parsers, bounds-checked views) while the hash is computed
    on native threads; :meth:`verified` waits for it and raises :class:`CorruptEntryError`
    (the entry removed) where it fails. NOTE: nothing that reaches native code (a kernel, a
    descriptor oneDNN deserializes) may read the payload before :meth:`verified` returned."""

    payload: memoryview
    check: Any = None  # NOTE: () -> None, raises CorruptEntryError; None: verified already
    # NOTE: verified() may be called from several threads (a rebuild's reorders wait on it)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def verified(self) -> memoryview:
        with self._lock:
            if self.check is not None:
                self.check()  # NOTE: raises on every call while the hash fails
                self.check = None
        return self.payload


def summary(meta: dict[str, Any], width: int = 200) -> dict[str, Any]:
    """The small items of ``meta``: what the index keeps (the full meta stays in the entry, read
    with :meth:`Store.read_meta`), so the index stays small however large the key parts grow."""
    return {
        k: v for k, v in meta.items() if k != "key" and len(json.dumps(v, default=str)) <= width
    }


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, data: bytes | list[Any], durable: bool = True) -> None:
    """Write ``data`` (bytes, or pieces written in order) to ``path`` atomically: a new file in
    the same (existing, private) directory, created ``O_EXCL`` under a random name, mode
    ``0600`` whatever the umask, fsynced (when ``durable``), then renamed over ``path``
    (readers never see a partial file; nothing staged is left behind)."""
    private_subdir(path.parent.parent, path.parent.name)  # NOTE: made 0700, or checked
    with staged_file(path, FILE_MODE) as (f, _):
        for piece in [data] if isinstance(data, bytes) else data:
            f.write(piece)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    if durable:
        _fsync_dir(path.parent)


_HEX = frozenset("0123456789abcdef")


def _index_row(key: object, row: object) -> bool:
    """Whether an index row is one the store wrote: a key that names an object, an integer
    size, a number for the last access, a dict for the meta. Anything else (a damaged or
    foreign index that still parses as JSON) makes the index unreadable, rebuilt from the
    objects: a row of another shape must not reach the eviction's arithmetic or
    :meth:`LocalStore.path`."""
    if not (isinstance(key, str) and len(key) >= 3 and all(c in _HEX for c in key)):
        return False
    if not isinstance(row, dict) or type(row.get("size")) is not int or row["size"] < 0:
        return False
    last = row.get("last_access", 0.0)
    return type(last) in (int, float) and isinstance(row.get("meta", {}), dict)


class LocalStore(Store):
    """Entries under ``root`` (``objects/``, ``index.json``, ``index.lock``); ``max_bytes``
    (default ``$PLAIT_CACHE_MAX_BYTES``, else 8 GiB) bounds their total size."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes) if max_bytes is not None else max_bytes_setting()
        self.objects = self.root / "objects"
        self._lock = FileLock(str(self.root / "index.lock"), mode=FILE_MODE)
        self.problems: list[str] = []  # NOTE: index problems found and repaired, for reports
        self._index_checked = False
        # NOTE: at most one read ahead, taken over (or dropped) by the next get_pending
        self._ahead: dict[str, Pending | CorruptEntryError | None] = {}

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def _private_root(self) -> Path:
        """The root, created ``0700``; raises :class:`~plait.ir.private_files.UnsafeDirectoryError`
        (an ``OSError``) when another user owns it or others may write it: its entries would
        be theirs to choose."""
        return private_dir(self.root)

    def path(self, key: str) -> Path:
        if len(key) < 3 or not all(c in "0123456789abcdef" for c in key):
            raise InvalidOptionError(f"not a cache key: {key!r}")
        return self.objects / key[:2] / key

    # --- the index (a cache of the objects, rebuilt when unreadable) -------------------------
    @contextlib.contextmanager
    def _index(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The index entries, under the lock; written back when the block ends."""
        self._private_root()
        try:
            self._lock.acquire(timeout=INDEX_LOCK_TIMEOUT)
        except Timeout:
            raise IndexLockTimeout(
                f"{self.root / 'index.lock'} was held by another process for more than "
                f"{INDEX_LOCK_TIMEOUT:g} s (a stopped or hung process?); the index was not updated"
            ) from None
        try:
            entries = self._read_index()
            yield entries
            data = {"schema": INDEX_SCHEMA, "entries": entries}
            # NOTE: not fsynced (every read updates it): the index is a cache of the objects;
            # one a crash left unreadable is rebuilt from them.
            text = json.dumps(data, sort_keys=True).encode()
            write_atomic(self.root / "index.json", text, durable=False)
        finally:
            self._lock.release()

    def _read_index(self) -> dict[str, dict[str, Any]]:
        path = self.root / "index.json"
        if not path.exists():
            return self._scan() if self.objects.exists() else {}
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict) or data.get("schema") != INDEX_SCHEMA:
                raise StoreFormatError(
                    f"schema {data.get('schema') if isinstance(data, dict) else '?'}"
                )
            entries = data["entries"]
            if not isinstance(entries, dict) or not all(
                _index_row(k, v) for k, v in entries.items()
            ):
                raise StoreFormatError("malformed entries")
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            self.problems.append(f"index.json unreadable ({exc}); rebuilt from the objects")
            return self._scan()
        return entries

    def _scan(self) -> dict[str, dict[str, Any]]:
        """Index entries from the objects themselves (verified; corrupt ones removed)."""
        out: dict[str, dict[str, Any]] = {}
        for key, path in self._object_paths():
            try:
                meta, _, _ = map_entry(path)
                if meta.get("key") != key:
                    raise StoreFormatError(f"it was stored under another key ({meta.get('key')!r})")
            except (OSError, ValueError) as exc:
                self._remove(path)
                self.problems.append(f"entry {key[:16]}… removed: {exc}")
                continue
            st = path.stat()
            out[key] = {"size": st.st_size, "last_access": st.st_mtime, "meta": summary(meta)}
        return out

    def _object_paths(self) -> Iterator[tuple[str, Path]]:
        if not self.objects.exists():
            return
        for sub in sorted(self.objects.iterdir()):
            if not sub.is_dir():
                continue
            for path in sorted(sub.iterdir()):
                if not path.name.startswith("."):
                    yield path.name, path

    @staticmethod
    def _remove(path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    # --- Store ---------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        payload = self.get_buffer(key)
        return None if payload is None else bytes(payload)

    def get_buffer(self, key: str) -> memoryview | None:
        pending = self.get_pending(key)
        return None if pending is None else pending.verified()

    def read_ahead(self, key: str) -> None:
        self._ahead.clear()
        try:
            self._ahead[key] = self._read_pending(key)
        except CorruptEntryError as exc:  # NOTE: raised again where the entry is read
            self._ahead[key] = exc

    def get_pending(self, key: str) -> Pending | None:
        if key in self._ahead:
            ahead = self._ahead.pop(key)
            if isinstance(ahead, CorruptEntryError):
                raise ahead
            return ahead
        self._ahead.clear()
        return self._read_pending(key)

    def _read_pending(self, key: str) -> Pending | None:
        path = self.path(key)
        self._private_root()  # NOTE: raises (an OSError) for a root others could have written
        try:
            view, digest, n_meta, start = frame(open_mapping(path))
            check_key(view[HEADER.size : HEADER.size + n_meta], key)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._discard(key)
            raise CorruptEntryError(key, f"unreadable: {exc}") from None
        except ValueError as exc:
            self._discard(key)
            raise CorruptEntryError(key, str(exc)) from None
        job = native_hash.start([[view[HEADER.size :]]])
        failed: list[str] = []  # NOTE: why the check failed, once it did

        def check() -> None:
            # NOTE: the entry is removed on the first failure only: a later caller (a rebuild's
            # reorder thread that outlived it) must not remove what replaced it since.
            if not failed and job.result()[0] != digest:
                failed.append(str(hash_error()))
                self._discard(key)
            if failed:
                raise CorruptEntryError(key, failed[0])

        # NOTE: a read marks the object's mtime (one syscall), not the index (a locked rewrite
        # of index.json on every warm start); the index takes it in when it orders entries.
        with contextlib.suppress(OSError):
            os.utime(path)
        self._check_index()
        return Pending(view[start:], check)

    def _check_index(self) -> None:
        """Once per store object: an unreadable index is found on a read too (an unlocked read
        of it; rebuilt, reported, under the lock only when it is unreadable)."""
        if self._index_checked:
            return
        self._index_checked = True
        path = self.root / "index.json"
        try:
            data = json.loads(path.read_bytes())
            if isinstance(data, dict) and data.get("schema") == INDEX_SCHEMA:
                return
        except FileNotFoundError:
            return
        except (OSError, ValueError, UnicodeDecodeError):
            pass
        with self._index():
            pass  # NOTE: the locked read finds it unreadable (or repaired meanwhile) and rebuilds

    def read_meta(self, key: str) -> dict[str, Any] | None:
        try:
            meta = read_head(self.path(key))
        except (OSError, ValueError):
            return None
        # NOTE: the key the entry names is the store's framing, not the caller's meta
        return meta if meta.pop("key", None) == key else None

    def _discard(self, key: str) -> None:
        self._remove(self.path(key))
        # NOTE: the object is gone; a row the index keeps for it meanwhile is dropped later
        with contextlib.suppress(OSError), self._index() as index:
            index.pop(key, None)

    def put(self, key: str, payload: Payload, meta: dict[str, Any]) -> None:
        path = self.path(key)
        pieces = encode_entry(payload, {**meta, "key": key})  # NOTE: checked on every read
        self._private_root()
        write_atomic(path, pieces)
        size = sum(memoryview(p).nbytes for p in pieces)
        try:
            with self._index() as index:
                index[key] = {"size": size, "last_access": time.time(), "meta": summary(meta)}
                self._evict(index, keep=key)
        except IndexLockTimeout as exc:  # NOTE: a later write's index takes the object in
            raise IndexLockTimeout(f"the entry is published but not indexed: {exc}") from None

    def _refresh(self, index: dict[str, dict[str, Any]]) -> None:
        """Each row's last access, with the reads since it was written (objects' mtimes), and
        a row for each object the index lacks (a writer stopped between publishing an entry
        and indexing it; reads do not index, so this is where such an entry is counted)."""
        for key, path in self._object_paths():
            if key in index:
                continue
            with contextlib.suppress(OSError, ValueError):
                st = path.stat()
                meta = read_head(path)
                index[key] = {"size": st.st_size, "last_access": st.st_mtime, "meta": summary(meta)}
        for key, row in index.items():
            with contextlib.suppress(OSError, ValueError):
                mtime = self.path(key).stat().st_mtime
                row["last_access"] = max(row.get("last_access", 0.0), mtime)

    def _evict(self, index: dict[str, dict[str, Any]], keep: str) -> None:
        """Least recently used first, until the total fits (the entry just written stays)."""
        self._refresh(index)
        total = sum(row["size"] for row in index.values())
        for key in sorted(index, key=lambda k: index[k].get("last_access", 0.0)):
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            total -= index.pop(key)["size"]
            self._remove(self.path(key))

    def delete(self, key: str) -> bool:
        path = self.path(key)
        existed = path.exists()
        self._remove(path)
        with self._index() as index:
            existed = index.pop(key, None) is not None or existed
        return existed

    def list(self) -> list[EntryInfo]:
        with self._index() as index:
            self._refresh(index)
            rows = dict(index)
        return [
            EntryInfo(k, r["size"], r.get("last_access", 0.0), r.get("meta", {}))
            for k, r in sorted(rows.items(), key=lambda kv: -kv[1].get("last_access", 0.0))
        ]

    def stat(self) -> StoreStats:
        entries = self.list()
        return StoreStats(
            str(self.root), len(entries), sum(e.size for e in entries), self.max_bytes
        )

    def verify(self) -> VerifyReport:
        report = VerifyReport()
        with self._index() as index:
            report.problems += self.problems
            self.problems = []
            on_disk = {}
            for key, path in self._object_paths():
                report.checked += 1
                try:
                    meta, _, _ = map_entry(path)
                    if meta.get("key") != key:
                        raise StoreFormatError(
                            f"it was stored under another key ({meta.get('key')!r})"
                        )
                except (OSError, ValueError) as exc:
                    self._remove(path)
                    index.pop(key, None)
                    report.problems.append(f"entry {key[:16]}… removed: {exc}")
                    continue
                on_disk[key] = (path, meta)
            for key in [k for k in index if k not in on_disk]:
                index.pop(key)
                report.problems.append(f"index named {key[:16]}…, which has no object (removed)")
            for key, (path, meta) in on_disk.items():
                if key not in index:
                    st = path.stat()
                    row = {"size": st.st_size, "last_access": st.st_mtime, "meta": summary(meta)}
                    index[key] = row
                    report.problems.append(f"entry {key[:16]}… was missing from the index (added)")
        return report

    def clear(self) -> int:
        with self._index() as index:
            paths = list(self._object_paths())
            for _, path in paths:
                self._remove(path)
            index.clear()
        return len(paths)

"""The artifact cache's entry file format, as every store writes and reads it: a header (magic,
format, the chunked XXH3-128 hash of what follows, lengths), the meta JSON (naming the key the
entry was stored under), zero padding and the payload, ALIGN-aligned so that tensors can be built
on a mapping of the file. Encoding, framing checks, verification and the zero-copy mapping; the
stores (:mod:`plait.cache.store`, :mod:`plait.cache.remote`) decide where the bytes live.

Example:
    >>> pieces = encode_entry(b"payload", {"key": "k"})
    >>> meta, payload = decode_entry(b"".join(bytes(p) for p in pieces))
    >>> meta, bytes(payload)
    ({'key': 'k'}, b'payload')
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plait.codegen import native_hash
from plait.errors import StoreFormatError

MAGIC = b"PLAITART"
# NOTE: format 5: the meta names the key the entry was stored under, and a read under any other
# key refuses it; format 4 did not. The self-hash is the chunked XXH3-128 (plait.ir.chunked_hash)
# and the payload starts ALIGN-aligned (format 3: one XXH3-128 stream; 2: BLAKE3; 1: SHA-256,
# unaligned). A reader refuses every other format: no entry is read with another's rules.
FORMAT = 5
HASH = "XXH3-128"
ALIGN = 64
# NOTE: magic, format, stream_digest(meta + padding + payload), len(meta), len(payload); the payload
# starts at the first multiple of ALIGN after header + meta (zero padding, covered by the hash).
HEADER = struct.Struct(">8sH16sQQ")
# NOTE: a payload is bytes, or buffers (bytes-like) to be written in order (never joined).
Payload = bytes | Sequence[Any]


def _payload_offset(n_meta: int) -> int:
    return -(-(HEADER.size + n_meta) // ALIGN) * ALIGN


def _pieces(payload: Payload) -> list[memoryview]:
    parts = [payload] if isinstance(payload, (bytes, bytearray, memoryview)) else list(payload)
    return [memoryview(p).cast("B") for p in parts]


def encode_entry(payload: Payload, meta: dict[str, Any]) -> list[Any]:
    """An entry's bytes, in pieces: header (with the XXH3-128 hash of what follows), meta JSON,
    zero padding (the payload starts ALIGN-aligned, so tensors built on a mapping of the file
    are aligned), payload (its pieces as given, so a large payload is never copied to be
    framed)."""
    meta_bytes = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    pad = bytes(_payload_offset(len(meta_bytes)) - HEADER.size - len(meta_bytes))
    pieces = _pieces(payload)
    digest = native_hash.digest([meta_bytes, pad, *pieces])
    n_payload = sum(p.nbytes for p in pieces)
    header = HEADER.pack(MAGIC, FORMAT, digest, len(meta_bytes), n_payload)
    return [header, meta_bytes, pad, *pieces]


def frame(data: Any) -> tuple[memoryview, bytes, int, int]:
    """``(view, digest, len(meta), payload offset)`` of an entry's bytes, its framing checked
    (magic, format, length), its hash not yet. Raises ``ValueError`` naming what is wrong."""
    view = memoryview(data).cast("B")
    if len(view) < HEADER.size:
        raise StoreFormatError(f"truncated: {len(view)} bytes, shorter than the header")
    magic, fmt, digest, n_meta, n_payload = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise StoreFormatError(f"not a plait cache entry (magic {magic!r})")
    if fmt != FORMAT:
        raise StoreFormatError(f"not a plait cache entry of format {FORMAT} (format {fmt})")
    start = _payload_offset(n_meta)
    if len(view) != start + n_payload:
        have, expected = len(view) - HEADER.size, start + n_payload - HEADER.size
        raise StoreFormatError(f"truncated: {have} bytes after the header, expected {expected}")
    return view, digest, n_meta, start


def check_key(meta: memoryview, key: str) -> None:
    """Raise ``ValueError`` unless the entry's meta names ``key``: an entry copied or moved
    under another key (another program's, valid by its own hash) is never served for this
    one. NOTE: read before the hash is checked (a Python parser on unverified bytes); a
    damaged meta fails here as damage."""
    try:
        stored = json.loads(bytes(meta)).get("key")
    except (ValueError, AttributeError) as exc:
        raise StoreFormatError(f"meta unreadable: {exc}") from None
    if stored != key:
        other = f"{stored[:16]}…" if isinstance(stored, str) else repr(stored)
        raise StoreFormatError(f"it was stored under another key ({other})")


def hash_error() -> StoreFormatError:
    return StoreFormatError(f"content does not match its {HASH} hash")


def decode_entry(data: Any) -> tuple[dict[str, Any], memoryview]:
    """``(meta, payload)`` of an entry's bytes (any buffer: bytes, a mapping); the payload is a
    view of ``data``, not a copy. Raises ``ValueError`` naming what is wrong with ``data``."""
    view, digest, n_meta, start = frame(data)
    if native_hash.digest([view[HEADER.size :]]) != digest:
        raise hash_error()
    try:
        meta = json.loads(bytes(view[HEADER.size : HEADER.size + n_meta]))
    except ValueError as exc:
        raise StoreFormatError(f"meta is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise StoreFormatError("meta is not a JSON object")
    return meta, view[start:]


def open_mapping(path: Path) -> Any:
    """The entry's bytes: a private (copy-on-write) mapping of the file, or a copy where the
    file system cannot map files. Raises ``OSError`` (absent, unreadable) or ``ValueError``."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER.size:
            raise StoreFormatError(f"truncated: {size} bytes, shorter than the header")
        try:
            # NOTE: the mapping holds the inode opened here: an entry replaced or removed
            # meanwhile (os.replace, eviction) leaves this reader's bytes as they were.
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):  # NOTE: a file system that cannot map files: read it
            data = bytearray(size)
            if f.readinto(data) != size:
                raise StoreFormatError("truncated while it was read") from None
            return data


def map_entry(path: Path) -> tuple[dict[str, Any], memoryview, int]:
    """``(meta, payload, size)`` of the entry at ``path``, verified; the payload is a writable
    view of a private (copy-on-write) mapping of the file: nothing is copied, and a write to the
    view never reaches the file. Raises ``OSError`` (absent, unreadable) or ``ValueError``."""
    data = open_mapping(path)
    meta, payload = decode_entry(data)
    return meta, payload, len(data)


def read_head(path: Path) -> dict[str, Any]:
    """An entry's meta, read from its head without the payload (not verified: for
    explanations, never for loading)."""
    with path.open("rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise StoreFormatError("truncated")
        magic, fmt, _, n_meta, _ = HEADER.unpack(head)
        if magic != MAGIC or fmt != FORMAT:
            raise StoreFormatError(f"not a plait cache entry of format {FORMAT}")
        meta = json.loads(f.read(n_meta))
        if not isinstance(meta, dict):  # NOTE: a TypeError would escape the callers' checks
            raise StoreFormatError("meta is not a JSON object")
        return meta

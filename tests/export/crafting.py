"""Making malformed and malicious artifacts: members read raw, changed, and written back with an
index that agrees with them (so that each check is reached on its own), or raw zip entries with
whatever names, modes and declared sizes an attacker would write."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INDEX = "artifact.json"


def members_of(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def reindexed(members: Mapping[str, bytes], **header: Any) -> dict[str, bytes]:
    """``members`` with an index that lists each one with its SHA-256 and size (header fields
    changed as given)."""
    index = json.loads(members[INDEX])
    index.update(header)
    index["members"] = {
        name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        for name, data in sorted(members.items())
        if name != INDEX
    }
    return {**members, INDEX: json.dumps(index, sort_keys=True).encode()}


def digest(members: Mapping[str, bytes]) -> str:
    return "sha256:" + hashlib.sha256(members[INDEX]).hexdigest()


def write(path: Path, entries: Any, symlinks: tuple[str, ...] = ()) -> Path:
    """A zip archive of ``entries`` (a mapping, or (name, bytes) pairs: names repeat as
    given); members named in ``symlinks`` are stored as symbolic links."""
    pairs = entries.items() if isinstance(entries, Mapping) else entries
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in pairs:
            info = zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0))
            kind = stat.S_IFLNK if name in symlinks else stat.S_IFREG
            info.external_attr = (kind | 0o644) << 16
            zf.writestr(info, data)
    path.write_bytes(buf.getvalue())
    return path


def declare_size(path: Path, member: str, size: int) -> None:
    """Rewrite the declared (uncompressed) size of ``member`` in the archive's headers."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for sig, offset, name_at in ((b"PK\x01\x02", 24, 46), (b"PK\x03\x04", 22, 30)):
        at = data.find(sig)
        while at >= 0:
            if bytes(data[at + name_at : at + name_at + len(name)]) == name:
                struct.pack_into("<I", data, at + offset, size)
            at = data.find(sig, at + 4)
    path.write_bytes(bytes(data))


def safetensors_bytes(header: Mapping[str, Any], body: bytes) -> bytes:
    text = json.dumps(dict(header)).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + body

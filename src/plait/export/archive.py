"""The artifact container: a zip archive of named members, read with every check first.

Writing (:func:`write_archive`) is deterministic: members in name order, fixed timestamps and
permissions, text deflated and tensors and libraries stored, so one export gives the same bytes
on every run. The index ``artifact.json`` lists every other member with its SHA-256 and size;
the SHA-256 of the index is the artifact's :func:`digest`, what ``trust=`` names.

Reading (:func:`read_archive`) never extracts anything to disk. It refuses, with an
:class:`~plait.errors.ArtifactFormatError` naming the member: a file that is not a regular file
(a symlink, a FIFO) or is larger than the limit; a truncated or damaged zip; a member name that
is absolute, climbs out (``..``), has a backslash, a drive or a control character, is a
directory or repeats; a member stored as a symlink (or any non-regular file type); an encrypted
member or an unknown compression method; a member whose declared size is past its limit
(checked before a byte of it is read); a member the index does not list, or whose bytes do not
match the index's SHA-256.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "a.plait")
    >>> index = write_archive(path, {"program.ir": b"graph() { return }"}, {"format": FORMAT})
    >>> members = read_archive(path, Limits())
    >>> members.read("program.ir"), members.index["format"]
    (b'graph() { return }', 'plait.export')
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import stat
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.errors import ArtifactFormatError, ArtifactVersionError
from plait.ir.private_files import publish_bytes, read_regular

FORMAT = "plait.export"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
INDEX = "artifact.json"
# NOTE: every member a version-1 artifact may hold; anything else is refused.
MEMBERS = (
    "program.ir",
    "captured.ir",
    "weights.safetensors",
    "calling.json",
    "guards.json",
    "manifest.json",
    "contract.toml",
    "reference.safetensors",
    "reference.json",
    "native/index.json",
)
NATIVE_LIBRARY = re.compile(r"native/[0-9a-f]{64}\.so")
# NOTE: a compiled Triton kernel's metadata or binary, or a launcher, under its Triton cache key
NATIVE_TRITON = re.compile(
    r"native/triton/[A-Z2-7]{1,104}/[A-Za-z0-9_.-]{1,200}\.(json|cubin|hsaco|so)"
)
_STORED_SUFFIXES = (".safetensors", ".so")
_TIMESTAMP = (1980, 1, 1, 0, 0, 0)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")


@dataclass(frozen=True)
class Limits:
    """Sizes a load refuses to go past, checked before anything of that size is allocated:
    ``archive_bytes`` (the file), ``text_bytes`` (each JSON, TOML or IR member),
    ``tensor_bytes`` (each safetensors member, and each static value of the program),
    ``native_bytes`` (the native libraries together) and ``members`` (how many)."""

    archive_bytes: int = 64 << 30
    text_bytes: int = 256 << 20
    tensor_bytes: int = 32 << 30
    native_bytes: int = 1 << 30
    members: int = 4096

    def member_bytes(self, name: str) -> int:
        if name.endswith(".safetensors"):
            return self.tensor_bytes
        if is_native(name):
            return self.native_bytes
        return self.text_bytes


def known_member(name: str) -> bool:
    return name in MEMBERS or is_native(name)


def is_native(name: str) -> bool:
    """Whether ``name`` is a native kernel member (a library, a Triton kernel or launcher)."""
    return bool(NATIVE_LIBRARY.fullmatch(name) or NATIVE_TRITON.fullmatch(name))


def check_member_name(name: str) -> None:
    """Refuse a member name that could name anything outside the archive's own namespace."""
    if not name or len(name) > 255:
        raise ArtifactFormatError(f"member name {name!r}: empty or longer than 255 characters")
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        raise ArtifactFormatError(f"member name {name!r} is an absolute path")
    if name.endswith("/"):
        raise ArtifactFormatError(f"member {name!r} is a directory")
    if "\\" in name:
        raise ArtifactFormatError(f"member name {name!r} has a backslash")
    if any(part in ("..", ".", "") for part in name.split("/")):
        raise ArtifactFormatError(f"member name {name!r} climbs out of the archive (., .., //)")
    if not _SAFE_NAME.fullmatch(name):
        raise ArtifactFormatError(f"member name {name!r} has characters outside [A-Za-z0-9_.-/]")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def claim(members: Members, name: str, digest: object, declared: set[str], index: str) -> None:
    """Record member ``name`` as declared by ``index``: refused when it is missing, declared
    twice, or its bytes do not hash to ``digest`` (hex SHA-256)."""
    if name in declared or not members.has(name):
        raise ArtifactFormatError(f"{index}: {name} is missing or declared twice")
    if sha256(members.read(name)) != digest:
        raise ArtifactFormatError(f"{name} does not match its SHA-256 in {index}")
    declared.add(name)


def digest(index_bytes: bytes) -> str:
    """The artifact's digest: ``sha256:`` and the SHA-256 of its index (which names the SHA-256
    of every other member)."""
    return f"sha256:{sha256(index_bytes)}"


def index_bytes(index: Mapping[str, Any]) -> bytes:
    return (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()


def build_index(header: Mapping[str, Any], members: Mapping[str, bytes]) -> dict[str, Any]:
    """The index of ``members``: ``header`` with the format, its version and each member's
    SHA-256 and size."""
    index = {"format": FORMAT, "version": VERSION, **header}
    index["members"] = {
        name: {"sha256": sha256(data), "bytes": len(data)} for name, data in sorted(members.items())
    }
    return index


def write_archive(
    path: str | Path, members: Mapping[str, bytes], header: Mapping[str, Any]
) -> dict[str, Any]:
    """Write ``members`` and their index (:func:`build_index`) as a zip archive at ``path``,
    atomically; returns the index."""
    index = build_index(header, members)
    data = pack_archive({INDEX: index_bytes(index), **members})
    publish_bytes(Path(path), data, 0o644)
    return index


def pack_archive(members: Mapping[str, bytes]) -> bytes:
    """The zip archive of ``members`` as bytes, deterministic (see the module doc)."""
    for name in members:
        check_member_name(name)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(members, key=lambda n: (n != INDEX, n)):
            info = zipfile.ZipInfo(name, _TIMESTAMP)
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            stored = name.endswith(_STORED_SUFFIXES)
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            zf.writestr(info, members[name])
    return buf.getvalue()


@dataclass
class Members:
    """An archive's members, read and checked against its index; ``index`` is the parsed index
    and ``digest`` the artifact's digest."""

    index: dict[str, Any]
    digest: str
    data: dict[str, bytes] = field(default_factory=dict)

    def read(self, name: str) -> bytes:
        if name not in self.data:
            raise ArtifactFormatError(f"the artifact has no member {name}")
        return self.data[name]

    def has(self, name: str) -> bool:
        return name in self.data

    def text(self, name: str) -> str:
        try:
            return self.read(name).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ArtifactFormatError(
                f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from None

    def json(self, name: str) -> Any:
        return parse_json(name, self.read(name))


def parse_json(name: str, data: bytes) -> Any:
    """JSON of a member: UTF-8, no NaN or infinity, not nested past what Python parses."""

    def constant(text: str) -> Any:
        raise ArtifactFormatError(f"{text} is not JSON")

    try:
        return json.loads(data.decode("utf-8"), parse_constant=constant)
    except UnicodeDecodeError as exc:
        raise ArtifactFormatError(f"{name}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise ArtifactFormatError(f"{name}: JSON nested too deep") from None
    except ValueError as exc:
        raise ArtifactFormatError(f"{name}: not JSON ({exc})") from None


def read_archive(path: str | Path, limits: Limits) -> Members:
    """Every member of the artifact at ``path``, checked (see the module doc)."""
    try:
        raw = read_regular(path, limit=limits.archive_bytes)
    except ValueError:
        raise ArtifactFormatError(
            f"{path}: larger than the load's limit of {limits.archive_bytes} bytes"
        ) from None
    except OSError as exc:
        # NOTE: O_NOFOLLOW: a symlink is refused with ELOOP
        raise ArtifactFormatError(f"{path}: cannot be read as a regular file ({exc})") from None
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
        infos = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise ArtifactFormatError(
            f"{path}: not a zip archive, or a truncated one ({exc})"
        ) from None
    if len(infos) > limits.members:
        raise ArtifactFormatError(f"{path}: {len(infos)} members, more than {limits.members}")
    seen: set[str] = set()
    for info in infos:
        _check_info(info, seen, len(raw), limits)
    if INDEX not in seen:
        raise ArtifactFormatError(f"{path}: no {INDEX}: not a plait export artifact")
    index_data = _read_member(zf, zf.getinfo(INDEX))
    index = parse_json(INDEX, index_data)
    listed = check_index(index)
    members = Members(index, digest(index_data))
    total_native = 0
    for info in infos:
        name = info.filename
        if name == INDEX:
            continue
        if name not in listed:
            raise ArtifactFormatError(f"member {name} is not listed in {INDEX}")
        want = listed[name]
        if info.file_size != want["bytes"]:
            raise ArtifactFormatError(
                f"member {name}: {info.file_size} bytes, {INDEX} says {want['bytes']}"
            )
        if is_native(name):
            total_native += info.file_size
            if total_native > limits.native_bytes:
                raise ArtifactFormatError(
                    f"native libraries past the load's limit of {limits.native_bytes} bytes"
                )
        data = _read_member(zf, info)
        if sha256(data) != want["sha256"]:
            raise ArtifactFormatError(f"member {name} does not match its SHA-256 in {INDEX}")
        members.data[name] = data
    missing = sorted(set(listed) - set(members.data))
    if missing:
        raise ArtifactFormatError(f"{INDEX} lists members the archive lacks: {missing}")
    return members


def _check_info(info: zipfile.ZipInfo, seen: set[str], archive: int, limits: Limits) -> None:
    name = info.filename
    check_member_name(name)
    if name in seen:
        raise ArtifactFormatError(f"member {name} appears twice")
    seen.add(name)
    if name != INDEX and not known_member(name):
        raise ArtifactFormatError(f"member {name} is not a member of format {FORMAT} {VERSION}")
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind == stat.S_IFLNK:
        raise ArtifactFormatError(f"member {name} is a symbolic link")
    if kind not in (0, stat.S_IFREG) or info.is_dir():
        raise ArtifactFormatError(f"member {name} is not a regular file (mode {oct(kind)})")
    if info.flag_bits & 0x1:
        raise ArtifactFormatError(f"member {name} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ArtifactFormatError(f"member {name}: compression method {info.compress_type}")
    cap = limits.member_bytes(name)
    if info.file_size > cap:
        raise ArtifactFormatError(
            f"member {name} declares {info.file_size} bytes, past the load's limit of {cap}"
        )
    if info.compress_size > archive:
        raise ArtifactFormatError(f"member {name} declares more bytes than the archive holds")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """The member's bytes: never more than its declared size (checked against its limit)."""
    try:
        with zf.open(info) as f:
            data = f.read(info.file_size + 1)
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, RuntimeError) as exc:
        # NOTE: zlib.error: damaged deflated data (zipfile passes it on as it is)
        raise ArtifactFormatError(f"member {info.filename} does not read ({exc})") from None
    if len(data) != info.file_size:
        raise ArtifactFormatError(
            f"member {info.filename}: {len(data)} bytes, its header says {info.file_size}"
        )
    return data


def check_index(index: Any) -> dict[str, dict[str, Any]]:
    """The members the index lists (name -> sha256, bytes), after the format checks."""
    if not isinstance(index, dict):
        raise ArtifactFormatError(f"{INDEX} is not a JSON object")
    if index.get("format") != FORMAT:
        raise ArtifactFormatError(f"{INDEX}: format {index.get('format')!r}, expected {FORMAT!r}")
    version = index.get("version")
    if type(version) is not int:
        raise ArtifactFormatError(f"{INDEX}: version {version!r} is not an integer")
    if version not in SUPPORTED_VERSIONS:
        raise ArtifactVersionError(
            f"artifact format version {version}; this plait reads versions "
            f"{list(SUPPORTED_VERSIONS)}" + (": upgrade plait" if version > VERSION else "")
        )
    listed = index.get("members")
    if not isinstance(listed, dict):
        raise ArtifactFormatError(f"{INDEX}: 'members' is not an object")
    out: dict[str, dict[str, Any]] = {}
    for name, info in listed.items():
        check_member_name(name)
        if not known_member(name):
            raise ArtifactFormatError(f"{INDEX} lists {name}, not a member of {FORMAT} {VERSION}")
        ok = (
            isinstance(info, dict)
            and isinstance(info.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", info["sha256"]) is not None
            and type(info.get("bytes")) is int
            and info["bytes"] >= 0
        )
        if not ok:
            raise ArtifactFormatError(f"{INDEX}: the entry of {name} is not {{sha256, bytes}}")
        out[name] = info
    return out

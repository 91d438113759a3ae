"""The identity of the plait code that made a cache entry: a digest of the installed package.

plait's version string does not change while its code does (an editable install, a developer's
tree, an upgrade that keeps the version), yet every entry is something plait's capture, passes
and code generation produced: an entry made by other code may hold another program. So the
artifact key's and the snapshot front key's ``toolchain`` parts carry ``plait_code``: SHA-256
over every file of the package (each ``.py`` module and the package data, such as the
numerical contract's TOML), by relative path and content; only ``__pycache__`` is left out (the
bytecode follows the sources).

Hashing the package (about 1.3 MB, some 110 files) costs 1-10 ms, too much for a warm start, so
the digest is computed once per process and remembered on disk in the private kernel cache
directory (:func:`plait.codegen.build.remembered`) for the files as they are: each one's path,
size, mtime, ctime and inode. NOTE: those stat fields only decide whether the remembered digest
may be reused (ctime and the inode change on every write or replacement of a file, whatever its
mtime says); the key part itself is always a content digest.

Example:
    >>> len(plait_code_digest())
    64
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from plait.codegen import build

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@cache
def plait_code_digest() -> str:
    """The digest of the plait package this process runs (computed once per process)."""
    return package_digest(PACKAGE_ROOT)


def package_digest(root: Path) -> str:
    """SHA-256 over every file under ``root`` (relative path and content), remembered on disk
    for the files' stat identities; a memo for other files is computed again and replaced."""
    identity = [list(row) for row in _file_stats(root)]
    memo = "plait_code-" + hashlib.sha256(str(root).encode()).hexdigest()[:16]
    value = build.remembered(memo, identity, lambda: {"sha256": content_digest(root)})
    return str(value["sha256"])


def content_digest(root: Path) -> str:
    """SHA-256 over each file under ``root`` in path order: its relative path, its length and
    its bytes. The key part; :func:`package_digest` only remembers it."""
    h = hashlib.sha256()
    for rel, *_ in _file_stats(root):
        data = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _file_stats(root: Path) -> list[tuple[str, int, int, int, int]]:
    """(relative path, size, mtime_ns, ctime_ns, inode) of every file under ``root``, sorted;
    ``__pycache__`` directories skipped."""
    out: list[tuple[str, int, int, int, int]] = []

    def walk(folder: str, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for e in entries:
                rel = prefix + e.name
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        walk(e.path, rel + "/")
                    continue
                st = e.stat()  # NOTE: a symlinked file is read through, so its target is stat'ed
                out.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))

    walk(str(root), "")
    out.sort()
    return out

"""Private directories and files: where plait keeps what it later trusts (cache entries, kernel
libraries, the native guard and hash libraries).

plait trusts a file in its caches only because nobody but the user could have written it. So
every directory plait keeps files in is checked by :func:`private_dir`: it must be a real
directory (not a symlink), owned by the user running plait, and writable by no one else (no
group or world write bit); every directory above it must be owned by the user or root and, when
others may write it, carry the sticky bit (``/tmp``), so that no one else can move it away.
Directories plait creates are made ``0700`` whatever the umask. A directory that fails a check
is refused with :class:`UnsafeDirectoryError` (an ``OSError`` naming the directory, what is
wrong and how to fix it); the caches catch it, warn, and go on without the cache (or, for
kernels, in a fresh private temporary directory), never with the refused directory.

Files are staged with :func:`staged_file` (``tempfile.mkstemp``: ``O_CREAT | O_EXCL``, a random
name, never following a planted symlink) with an explicit mode, and published with
``os.replace``.

This module sits in ``plait.ir`` (it imports nothing of plait) so that codegen, guards and the
cache all use this one definition.

Example:
    >>> import os, tempfile
    >>> root = private_dir(os.path.join(tempfile.mkdtemp(), "cache", "kernels"))
    >>> oct(os.stat(root).st_mode & 0o777)
    '0o700'
    >>> publish_bytes(root / "entry", b"data")
    >>> (root / "entry").read_bytes(), oct(os.stat(root / "entry").st_mode & 0o777)
    (b'data', '0o600')
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from plait.ir.errors import NotRegularFileError, StoredFileError

DIR_MODE = 0o700
FILE_MODE = 0o600
LIBRARY_MODE = 0o700
# NOTE: (path, device, inode, owner, mode) of the directories checked in this process
_CHECKED: set[tuple[str, int, int, int, int]] = set()
_LOCK = threading.Lock()


class UnsafeDirectoryError(OSError):
    """A directory plait would keep trusted files in is not private to this user."""

    def __init__(self, path: str | os.PathLike[str], problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = str(path), problem, fix
        super().__init__(f"plait refuses the directory {self.path}: {problem}; {fix}")


def _uid() -> int:
    return os.geteuid()


def _check_leaf(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectoryError(
            path, "it is a symbolic link", "remove the link or point the cache elsewhere"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(path, "it is not a directory", "remove it")
    if st.st_uid != _uid():
        raise UnsafeDirectoryError(
            path,
            f"it is owned by uid {st.st_uid}, not by this user (uid {_uid()})",
            "remove it, or point the cache at a directory of your own (PLAIT_CACHE_DIR)",
        )
    if st.st_mode & 0o022:
        raise UnsafeDirectoryError(
            path,
            f"it is writable by others (mode {oct(st.st_mode & 0o777)})",
            f"run `chmod go-w {path}` or remove it",
        )


def _check_ancestor(path: Path, st: os.stat_result) -> None:
    if st.st_uid not in (0, _uid()):
        raise UnsafeDirectoryError(
            path,
            f"a directory above the cache is owned by uid {st.st_uid}",
            "keep the cache under directories owned by you or root",
        )
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectoryError(
            path,
            f"a directory above the cache is writable by others without the sticky bit "
            f"(mode {oct(st.st_mode & 0o7777)}): they could move the cache away",
            f"run `chmod go-w {path}` or keep the cache elsewhere",
        )


def _make(path: Path) -> None:
    """Create ``path`` and any missing parent, each ``0700`` whatever the umask."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # NOTE: made meanwhile (another process): checked like any other
        os.chmod(d, DIR_MODE, follow_symlinks=False)  # NOTE: the umask may have removed bits


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory private to this user, created ``0700`` (with its missing parents)
    when absent. Raises :class:`UnsafeDirectoryError` when it is a symlink, not a directory,
    owned by another user or writable by others, or when a directory above it lets others
    move it away; ``OSError`` when it cannot be created.

    Example:
        >>> import tempfile
        >>> private_dir(tempfile.mkdtemp()).is_dir()
        True
    """
    path = Path(os.path.abspath(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        # NOTE: nothing is created under a directory others control
        for parent in reversed(path.parents):
            if not os.path.lexists(parent):
                break
            _check_ancestor(parent, os.stat(parent))
        _make(path)
        st = os.lstat(path)
    ident = (str(path), st.st_dev, st.st_ino, st.st_uid, st.st_mode)
    if ident in _CHECKED:
        return path
    _check_leaf(path, st)
    for parent in path.parents:
        _check_ancestor(parent, os.stat(parent))
    with _LOCK:
        _CHECKED.add(ident)
    return path


def private_subdir(root: Path, *names: str) -> Path:
    """A directory under a :func:`private_dir` ``root`` (already checked), created ``0700``;
    one that exists must be a directory of this user's that others cannot write."""
    path = root.joinpath(*names)
    _make(path)
    _check_leaf(path, os.lstat(path))
    return path


def fresh_private_dir(prefix: str) -> Path:
    """A new directory no one else can have prepared (``tempfile.mkdtemp``: a random name,
    ``0700``): where plait works when its usual directory is refused."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def staged_file(path: Path, mode: int = FILE_MODE) -> Iterator[tuple[IO[bytes], Path]]:
    """A new file beside ``path`` (``O_CREAT | O_EXCL``, a random name: never a planted file or
    symlink), given ``mode`` whatever the umask; the caller writes it, then it is renamed over
    ``path`` (``os.replace``) when the block ends without an error, else removed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    staged = Path(tmp)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f, staged
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            staged.unlink()
        raise


def publish_bytes(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Publish ``data`` at ``path`` atomically through :func:`staged_file`."""
    with staged_file(path, mode) as (f, _):
        f.write(data)


def read_regular(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of a regular file, opened without following a final symlink and without
    blocking (a FIFO or a device is refused, never read). Raises ``OSError`` (``ValueError``
    when it is larger than ``limit`` bytes)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{path} is not a regular file")
        if limit is not None and st.st_size > limit:
            raise StoredFileError(f"{path} is larger than {limit} bytes")
        return f.read()

"""Building kernels: the system C++ compiler, a content-addressed cache, ctypes loading.

Kernels are grouped into translation units (a few per program, built in parallel); each unit is
one shared library. A unit's cache key is the SHA-256 of everything that decides its machine
code: the source, the compiler's path and version, the flags, and the CPU's feature flags (the
flags say ``-march=native``). Libraries are published atomically (written under a temporary name,
then ``os.replace``) with their SHA-256 beside them; an entry whose bytes do not match its hash is
discarded and rebuilt.

The cache directory is ``$PLAIT_CACHE_DIR`` or ``~/.cache/plait/kernels``. ``STATS`` counts
compiler invocations and cache hits in this process; with ``PLAIT_STAX_NO_COMPILE=1`` in the
environment any compiler invocation raises (tests use it to prove a warm cache is used).

Example:
    >>> tc = toolchain()
    >>> "-fopenmp" in tc.flags
    True
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from plait.codegen.errors import BuildError
from plait.codegen.prelude import PRELUDE

# NOTE: bump when the printer's output changes meaning without changing its text (never silently).
CODEGEN_VERSION = "stax-cpp-1"
BASE_FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-std=c++17",
    "-fwrapv",
    "-fno-math-errno",
    "-ffp-contract=off",
    "-fno-semantic-interposition",
)
STATS = {"compiles": 0, "hits": 0, "memory_hits": 0}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Toolchain:
    """The compiler and everything about it that a cache key must name."""

    cxx: str
    version: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    cpu_flags: str
    libmvec: bool

    def key_parts(self) -> dict[str, object]:
        return {
            "codegen": CODEGEN_VERSION,
            "cxx": self.cxx,
            "version": self.version,
            "flags": list(self.flags),
            "libs": list(self.libs),
            "cpu_flags": self.cpu_flags,
        }

    def record(self) -> dict[str, object]:
        """What the manifest records about the toolchain."""
        return {**self.key_parts(), "libmvec": self.libmvec}


@cache
def cpu_info() -> tuple[str, str]:
    """The CPU's model name and its feature flags (sorted, space-separated), read from
    ``/proc/cpuinfo`` once per process; empty strings where it says nothing."""
    model = flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            if key.strip() in ("flags", "Features") and not flags:
                flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return model, flags


def _cpu_flags() -> str:
    import platform

    return cpu_info()[1] or platform.processor() or platform.machine()


@cache
def toolchain() -> Toolchain:
    """Probe the system C++ compiler once per process (``$CXX``, else ``g++``, else ``c++``).
    The probe's answers (its version, whether glibc's vector math library links) are
    remembered on disk for the compiler binary and the linker cache as they are
    (:func:`remembered`): a warm start runs no subprocess."""
    candidates = [os.environ.get("CXX"), "g++", "c++"]
    cxx = next((shutil.which(c) for c in candidates if c and shutil.which(c)), None)
    if cxx is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    cxx = os.path.realpath(cxx)
    identity = [file_identity(Path(cxx)), file_identity(Path("/etc/ld.so.cache"))]
    probe = remembered("toolchain", identity, lambda: _probe_compiler(cxx))
    version, libmvec = str(probe["version"]), bool(probe["libmvec"])
    flags = (*BASE_FLAGS, f"-DPLAIT_LIBMVEC={int(libmvec)}")
    libs = ("-lmvec",) if libmvec else ()
    return Toolchain(cxx, version, flags, libs, _cpu_flags(), libmvec)


def _probe_compiler(cxx: str) -> dict[str, object]:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    version = out.stdout.splitlines()[0] if out.stdout else "unknown"
    return {"version": version, "libmvec": _has_libmvec(cxx)}


def file_identity(path: Path) -> list[object]:
    """A file as it is now (path, size, mtime, inode; None fields when it is absent): what a
    memo of something derived from it is keyed by. Never a cache key part."""
    try:
        st = path.stat()
    except OSError:
        return [str(path), None, None, None]
    return [str(path), st.st_size, st.st_mtime_ns, st.st_ino]


def remembered(
    name: str, identity: Sequence[object], compute: Callable[[], dict[str, object]]
) -> dict[str, object]:
    """``compute()`` (a JSON object), remembered in the cache directory under ``name`` for
    ``identity``: a probe that costs a subprocess or a slow call runs once per machine and
    installation, not once per process. The memo is only ever a shortcut to what ``compute``
    answers; one that is unreadable or for another identity is computed again and replaced."""
    try:
        memo = cache_dir() / f"{name}.json"
    except BuildError:
        return compute()
    try:
        saved = json.loads(memo.read_text())
        if isinstance(saved, dict) and saved.get("identity") == json.loads(json.dumps(identity)):
            value = saved.get("value")
            if isinstance(value, dict):
                return value
    except (OSError, ValueError):
        pass
    value = compute()
    staged = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
    try:
        staged.write_text(json.dumps({"identity": identity, "value": value}))
        os.replace(staged, memo)
    except OSError:
        staged.unlink(missing_ok=True)
    return value


def cached_blob(kind: str, key: str, make: Callable[[], bytes]) -> bytes:
    """Bytes that ``key`` alone decides (``make()``), kept in the kernel cache as
    ``<cache_dir>/<kind>/<key>`` with the SHA-256 published beside them: made once per cache,
    read back afterwards. A blob that fails its check (or cannot be read) is made again and
    replaced; where the cache cannot be written, ``make()`` answers alone.

    Example:
        >>> cached_blob("doc-example", "k" * 64, lambda: b"made once")
        b'made once'
    """
    try:
        path = cache_dir() / kind / key
        path.parent.mkdir(exist_ok=True)
    except (BuildError, OSError):
        return make()
    data = _checked_bytes(path)
    if data is not None:
        return data
    data = make()
    store_blob(kind, key, data)
    return data


def store_blob(kind: str, key: str, data: bytes) -> None:
    """Publish (or replace) the blob :func:`cached_blob` reads; a cache that cannot be written
    keeps nothing (the blob is made again next time, never wrong)."""
    with contextlib.suppress(BuildError, OSError):
        path = cache_dir() / kind / key
        path.parent.mkdir(exist_ok=True)
        _publish(data, path)


def _has_libmvec(cxx: str) -> bool:
    """glibc's vector math library: present on glibc x86-64 systems, linked with ``-lmvec``."""
    import ctypes.util
    import platform

    return (
        platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None
    )


def cache_dir() -> Path:
    """``$PLAIT_CACHE_DIR``, else ``~/.cache/plait/kernels``; a per-user temporary directory when
    that cannot be created (a read-only home)."""
    env = os.environ.get("PLAIT_CACHE_DIR")
    path = Path(env) if env else Path.home() / ".cache" / "plait" / "kernels"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        if env:
            raise BuildError(f"PLAIT_CACHE_DIR={env} cannot be created") from None
        path = Path(tempfile.gettempdir()) / f"plait-kernels-{os.getuid()}"
        path.mkdir(parents=True, exist_ok=True)
    return path


def installation_dir() -> Path:
    """Native code that depends on the installation alone, never on a program (the guard
    evaluator, the chunk hasher): ``$PLAIT_GUARDS_CACHE_DIR``, else ``~/.cache/plait/guards``;
    a per-user temporary directory when that cannot be created. A fresh ``PLAIT_CACHE_DIR``
    does not rebuild it."""
    env = os.environ.get("PLAIT_GUARDS_CACHE_DIR")
    path = Path(env) if env else Path.home() / ".cache" / "plait" / "guards"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = Path(tempfile.gettempdir()) / f"plait-guards-{os.getuid()}"
        path.mkdir(parents=True, exist_ok=True)
    return path


def installed_library(
    name: str, source: str, symbols: Sequence[str], flags: Sequence[str]
) -> ctypes.CDLL:
    """A small C/C++ library (``extern "C"`` symbols, no PyTorch) built once per installation
    into :func:`installation_dir`, keyed by its source, the compiler and version, and the
    flags; loaded with ctypes, its bytes checked against the SHA-256 published beside them
    (a mismatch is rebuilt). Raises :class:`BuildError` where it cannot be built."""
    tc = toolchain()
    parts = {"name": name, "source": source, "cxx": tc.cxx, "version": tc.version}
    key = hashlib.sha256(json.dumps({**parts, "flags": list(flags)}).encode()).hexdigest()
    path = installation_dir() / f"{name}-{key[:32]}.so"
    if not (path.exists() and _verified(path)):
        if os.environ.get("PLAIT_STAX_NO_COMPILE") == "1":
            raise BuildError(f"{name} not built: PLAIT_STAX_NO_COMPILE=1 forbids the compiler")
        with tempfile.TemporaryDirectory(prefix=f"plait-{name}-") as tmp:
            src, out = Path(tmp) / f"{name}.cpp", Path(tmp) / f"{name}.so"
            src.write_text(f'extern "C" {{\n{source}\n}}\n')
            cmd = [tc.cxx, *flags, "-fPIC", "-shared", str(src), "-o", str(out)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            with _LOCK:
                STATS["compiles"] += 1
            if proc.returncode != 0:
                raise BuildError(f"building {name} failed:\n{proc.stderr[-2000:]}")
            _publish(out.read_bytes(), path)
    lib = ctypes.CDLL(str(path))
    for sym in symbols:
        getattr(lib, sym)  # NOTE: fail now, not at the first call, if a symbol is missing.
    return lib


@dataclass
class Unit:
    """One translation unit: kernel definitions (symbol -> source), built into one library."""

    symbols: list[str]
    sources: list[str]
    key: str = ""
    path: Path | None = None
    seconds: float = 0.0
    cache_hit: bool = False
    lib: ctypes.CDLL | None = field(default=None, repr=False)

    def text(self) -> str:
        return PRELUDE + "\n" + "\n\n".join(self.sources) + "\n"


def unit_key(source: str, tc: Toolchain) -> str:
    payload = json.dumps({"source": source, **tc.key_parts()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


_LOADED: dict[str, ctypes.CDLL] = {}


def build_units(units: Sequence[Unit], jobs: int | None = None) -> None:
    """Build (or fetch from the cache) and load every unit, independent ones in parallel."""
    tc = toolchain()
    root = cache_dir()
    for u in units:
        u.key = unit_key(u.text(), tc)
        u.path = root / u.key[:2] / f"{u.key}.so"
    todo = [u for u in units if not _try_load(u)]
    if todo:
        workers = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
        if workers == 1:
            for u in todo:
                _compile(u, tc)
        else:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda u: _compile(u, tc), todo))
    for u in units:
        if u.lib is None:
            u.lib = _load(u)


def _try_load(u: Unit) -> bool:
    assert u.path is not None
    if u.key in _LOADED:
        u.lib, u.cache_hit = _LOADED[u.key], True
        with _LOCK:
            STATS["memory_hits"] += 1
        return True
    if u.path.exists():
        try:
            if not _verified(u.path):
                raise OSError(f"{u.path} does not match its recorded hash")
            u.lib = _load(u)
        except OSError:
            u.path.unlink(missing_ok=True)  # NOTE: a corrupt entry is discarded and rebuilt.
            return False
        u.cache_hit = True
        with _LOCK:
            STATS["hits"] += 1
        return True
    return False


def _digest_path(path: Path) -> Path:
    return path.with_suffix(".sha256")


def _checked_bytes(path: Path) -> bytes | None:
    """A published file's bytes when they match the hash published with it, else None."""
    try:
        recorded = _digest_path(path).read_text().strip()
        data = path.read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == recorded else None


def _verified(path: Path) -> bool:
    """An entry is used only when its bytes match the hash published with it."""
    return _checked_bytes(path) is not None


def _publish(data: bytes, path: Path) -> None:
    """Atomically publish a library and its hash (the hash last: an entry is complete when its
    hash is there)."""
    tag = f"{os.getpid()}.{threading.get_ident()}"
    digest = _digest_path(path)
    staged = path.with_name(f".{path.name}.{tag}")
    staged_digest = digest.with_name(f".{digest.name}.{tag}")
    try:
        staged.write_bytes(data)
        os.replace(staged, path)
        staged_digest.write_text(hashlib.sha256(data).hexdigest() + "\n")
        os.replace(staged_digest, digest)
    finally:  # NOTE: nothing staged is left behind (a replace refused, a disk full)
        staged.unlink(missing_ok=True)
        staged_digest.unlink(missing_ok=True)


def _load(u: Unit) -> ctypes.CDLL:
    assert u.path is not None
    lib = ctypes.CDLL(str(u.path))
    for sym in u.symbols:
        getattr(lib, sym)  # NOTE: fail now, not at the first call, if a symbol is missing.
    _LOADED[u.key] = lib
    return lib


def _compile(u: Unit, tc: Toolchain) -> None:
    if os.environ.get("PLAIT_STAX_NO_COMPILE") == "1":
        raise BuildError("compiler invocation refused: PLAIT_STAX_NO_COMPILE=1 (cache miss)")
    assert u.path is not None
    start = time.perf_counter()
    u.path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="plait-stax-") as tmp:
        src = Path(tmp) / "unit.cpp"
        src.write_text(u.text())
        out = Path(tmp) / "unit.so"
        cmd = [tc.cxx, *tc.flags, str(src), "-o", str(out), *tc.libs]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        with _LOCK:
            STATS["compiles"] += 1
        if proc.returncode != 0:
            raise BuildError(f"C++ compilation failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
        _publish(out.read_bytes(), u.path)
    u.seconds = time.perf_counter() - start

"""Building kernels: the system C++ compiler, a content-addressed cache, ctypes loading.

Kernels are grouped into translation units (a few per program, built in parallel); each unit is
one shared library. A unit's cache key is the SHA-256 of everything that decides its machine
code: the source, the compiler's path and version, the flags, and the CPU's feature flags (the
flags say ``-march=native``). Libraries are published atomically (staged in a file only this
process could have created, ``0700`` whatever the umask, then ``os.replace``) with a sidecar
beside them that names their SHA-256 and the key they were built for: an entry whose bytes do
not match, or that was built for another key (a library copied under this one's name), is
discarded and rebuilt, with one :class:`KernelCacheWarning` and an event in :data:`EVENTS` (the
artifact cache puts it in the manifest).

The cache directory is ``$PLAIT_CACHE_DIR`` or ``~/.cache/plait/kernels``, a private directory
(:func:`plait.ir.private_files.private_dir`: this user's, ``0700``, nobody else may write it);
one that is refused or cannot be created or written is replaced by a fresh private temporary
directory for this process, with one warning: a kernel cache problem costs the cache, never the
compile. ``STATS`` counts
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
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from plait.codegen.errors import BuildError
from plait.codegen.prelude import PRELUDE
from plait.errors import PlaitWarning
from plait.ir.private_files import (
    LIBRARY_MODE,
    fresh_private_dir,
    private_dir,
    private_subdir,
    publish_bytes,
)

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
# NOTE: what the kernel cache discarded or could not do, in order (each also warned once); the
# artifact cache copies those of a compile into its manifest's cache events
EVENTS: list[str] = []
_WARNED: set[str] = set()
_DIRS: dict[tuple[str, str], Path] = {}  # NOTE: (variable, its value) -> the directory used


class KernelCacheWarning(PlaitWarning):
    """The kernel cache discarded an entry, refused its directory or could not be written; the
    kernels were built (or loaded) without it."""


def report(message: str, once: str | None = None, warn: bool = True) -> None:
    """Record ``message`` in :data:`EVENTS` and warn (unless ``warn`` is false); with ``once``,
    warn only the first time that tag is reported in this process (a full disk or an unusable
    directory is said once, not per kernel; every occurrence is recorded)."""
    with _LOCK:
        EVENTS.append(message)
        if once is not None:
            warn = warn and once not in _WARNED
            _WARNED.add(once)
    if warn:
        warnings.warn(f"plait kernel cache: {message}", KernelCacheWarning, stacklevel=3)


# NOTE: the tag of every failure to read or write the kernel cache: warned once per process
UNUSABLE = "unusable"


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
    flags = (*BASE_FLAGS, *vector_width_flags(cpu_info()[1]), f"-DPLAIT_LIBMVEC={int(libmvec)}")
    libs = ("-lmvec",) if libmvec else ()
    return Toolchain(cxx, version, flags, libs, _cpu_flags(), libmvec)


def vector_width_flags(cpu_flags: str) -> tuple[str, ...]:
    """GCC's vector width for this CPU: 512 bits where it has AVX-512F. GCC's own default for
    AVX-512 CPUs is 256 bits, and then a loop calls glibc's 8-lane math functions: ``tanhf``
    ran at half the speed of its 16-lane version on an Intel Xeon (Sapphire Rapids), ``expf``
    at 0.8 (``benchmarks/vector_width.py``; ``benchmarks/RESULTS.md``, "Math functions in 16
    lanes"). Elsewhere nothing.

    Example:
        >>> vector_width_flags("avx2 avx512f fma")
        ('-mprefer-vector-width=512',)
        >>> vector_width_flags("avx2 fma")
        ()
    """
    return ("-mprefer-vector-width=512",) if "avx512f" in cpu_flags.split() else ()


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
    except OSError:  # NOTE: no directory at all (not even a temporary one): not remembered
        return compute()
    try:
        saved = json.loads(memo.read_text())
        if isinstance(saved, dict) and saved.get("identity") == json.loads(json.dumps(identity)):
            value = saved.get("value")
            if isinstance(value, dict):
                return value
    except (OSError, ValueError):  # NOTE: UnicodeDecodeError is a ValueError
        pass
    value = compute()
    with contextlib.suppress(OSError):  # NOTE: a memo not kept is probed again next time
        publish_bytes(memo, json.dumps({"identity": identity, "value": value}).encode())
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
        path = private_subdir(cache_dir(), kind) / key
    except OSError:
        return make()
    data = _checked_bytes(path, key)
    if data is not None:
        return data
    data = make()
    store_blob(kind, key, data)
    return data


def store_blob(kind: str, key: str, data: bytes) -> None:
    """Publish (or replace) the blob :func:`cached_blob` reads; a cache that cannot be written
    keeps nothing (the blob is made again next time, never wrong)."""
    try:
        _publish(data, private_subdir(cache_dir(), kind) / key, key)
    except OSError as exc:
        report(f"could not keep a {kind} blob ({exc})", once=UNUSABLE)


def _has_libmvec(cxx: str) -> bool:
    """glibc's vector math library: present on glibc x86-64 systems, linked with ``-lmvec``."""
    import ctypes.util
    import platform

    return (
        platform.machine() in ("x86_64", "AMD64") and ctypes.util.find_library("mvec") is not None
    )


def _private_cache(variable: str, default: Path, fallback: str) -> Path:
    """The directory ``$variable`` names (else ``default``) as a private directory; where it is
    refused or cannot be made, ``<tmp>/<fallback>-<uid>`` (checked the same way), else a fresh
    private temporary directory; each replacement is warned once per process."""
    env = os.environ.get(variable)
    memo = (variable, env or "")
    first = Path(env) if env else default
    if memo not in _DIRS:
        with contextlib.suppress(OSError):
            return private_dir(first)  # NOTE: checked (cheaply) on every use: it may be removed
    else:
        return _DIRS[memo]
    candidates = [first]
    if not env:
        candidates.append(Path(tempfile.gettempdir()) / f"{fallback}-{os.geteuid()}")
    problems = []
    path = None
    for candidate in candidates:
        try:
            path = private_dir(candidate)
            break
        except OSError as exc:
            problems.append(str(exc))
    if path is None:
        path = fresh_private_dir(f"{fallback}-")
    if problems:
        report(f"{'; '.join(problems)}; using {path} instead", once=f"dir:{memo}")
    with _LOCK:
        _DIRS[memo] = path
    return path


def cache_dir() -> Path:
    """``$PLAIT_CACHE_DIR``, else ``~/.cache/plait/kernels``: a private directory
    (:func:`~plait.ir.private_files.private_dir`). Where that one is refused (another user's,
    writable by others) or cannot be created (a read-only home): a per-user temporary directory
    (checked the same way), else a fresh private one for this process; warned once."""
    default = Path.home() / ".cache" / "plait" / "kernels"
    return _private_cache("PLAIT_CACHE_DIR", default, "plait-kernels")


def installation_dir() -> Path:
    """Native code that depends on the installation alone, never on a program (the guard
    evaluator, the chunk hasher): ``$PLAIT_GUARDS_CACHE_DIR``, else ``~/.cache/plait/guards``,
    private and replaced like :func:`cache_dir`'s. A fresh ``PLAIT_CACHE_DIR`` does not rebuild
    it."""
    default = Path.home() / ".cache" / "plait" / "guards"
    return _private_cache("PLAIT_GUARDS_CACHE_DIR", default, "plait-guards")


def installed_library(
    name: str, source: str, symbols: Sequence[str], flags: Sequence[str]
) -> ctypes.CDLL:
    """A small C/C++ library (``extern "C"`` symbols, no PyTorch) built once per installation
    into :func:`installation_dir`, keyed by its source, the compiler and version, and the
    flags; loaded with ctypes, its bytes checked against the sidecar published beside them
    (SHA-256 and key: a mismatch is rebuilt). Raises :class:`BuildError` where it cannot be
    built; one that cannot be kept (a full disk, a read-only directory) is loaded from where it
    was built, warned once."""
    tc = toolchain()
    # NOTE: "entry": the sidecar's format (with the key): an earlier plait's file is not shared
    parts = {"name": name, "source": source, "cxx": tc.cxx, "version": tc.version, "entry": 2}
    key = hashlib.sha256(json.dumps({**parts, "flags": list(flags)}).encode()).hexdigest()
    path = installation_dir() / f"{name}-{key[:32]}.so"
    if usable_entry(path, key):
        return _load_library(path, symbols)
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
        try:
            publish_library(out.read_bytes(), path, key)
        except OSError as exc:
            report(f"could not keep {name} in {path.parent} ({exc})", once=UNUSABLE)
            return _load_library(out, symbols)  # NOTE: stays mapped after tmp is removed
    return _load_library(path, symbols)


def _load_library(path: Path, symbols: Sequence[str]) -> ctypes.CDLL:
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


def adopt_library(key: str, path: Path, symbols: Sequence[str]) -> bool:
    """Load a kernel library built elsewhere as the unit ``key`` (its source and this machine's
    toolchain): later builds of that unit in this process use it, without the compiler and
    without the kernel cache (nothing is written). The caller vouches for the bytes (an export
    artifact the user trusts, :mod:`plait.export.native`). False when the unit is loaded
    already (the library is not loaded then)."""
    with _LOCK:
        if key in _LOADED:
            return False
    lib = _load_library(path, symbols)
    with _LOCK:
        _LOADED.setdefault(key, lib)
    return True


def _locate(u: Unit, tc: Toolchain, root: Path) -> None:
    """``u``'s key (its source and the toolchain) and its library's place in the cache."""
    u.key = unit_key(u.text(), tc)
    u.path = root / u.key[:2] / f"{u.key}.so"


def unit_file(symbols: Sequence[str], sources: Sequence[str]) -> Path:
    """The kernel cache's library of the unit made of these kernels (symbols in the unit's
    order), built into the cache when it is not there: a unit this process loaded from
    elsewhere (an adopted artifact's, a cache directory since changed or cleared) has no file
    here. Raises :class:`BuildError` where it cannot be built (``PLAIT_STAX_NO_COMPILE=1``)."""
    tc = toolchain()
    u = Unit(list(symbols), list(sources))
    _locate(u, tc, cache_dir())
    assert u.path is not None
    if not usable_entry(u.path, u.key):
        _compile(u, tc)
        if not usable_entry(u.path, u.key):
            raise BuildError(f"the kernel cache could not keep unit {u.key[:16]}")
    return u.path


def build_units(units: Sequence[Unit], jobs: int | None = None) -> None:
    """Build (or fetch from the cache) and load every unit, independent ones in parallel."""
    tc = toolchain()
    root = cache_dir()
    for u in units:
        _locate(u, tc, root)
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
    if not usable_entry(u.path, u.key):
        return False
    try:
        u.lib = _load(u)
    except OSError as exc:  # NOTE: it matched its sidecar yet does not load: rebuilt
        _discard(u.path, f"kernel library {u.path.name} does not load ({exc})")
        return False
    u.cache_hit = True
    with _LOCK:
        STATS["hits"] += 1
    return True


def _digest_path(path: Path) -> Path:
    return path.with_suffix(".sha256")


def _sidecar(data: bytes, key: str) -> bytes:
    """What is published beside an entry: its SHA-256 and the key it was made for."""
    return f"sha256 {hashlib.sha256(data).hexdigest()} key {key}\n".encode()


def _checked_bytes(path: Path, key: str) -> bytes | None:
    """A published file's bytes when they match the sidecar published with them and were made
    for ``key``, else None. An entry that is present and fails (damaged, another key's, a
    sidecar that is not text) is removed and reported; an absent or unreadable one is not."""
    try:
        recorded = _digest_path(path).read_bytes()
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        report(f"{path} unreadable ({exc})", once=UNUSABLE)
        return None
    if recorded == _sidecar(data, key):
        return data
    parts = recorded.split()
    if len(parts) == 1 and len(parts[0]) == 64:  # NOTE: an earlier plait's sidecar (no key)
        _discard(path, f"{path.name} has a sidecar of an earlier format", warn=False)
        return None
    if (
        len(parts) == 4
        and parts[:3] == [b"sha256", hashlib.sha256(data).hexdigest().encode(), b"key"]
        and parts[3] != key.encode()
    ):
        what = f"was made for another key ({parts[3][:16].decode('ascii', 'replace')}…)"
    else:
        what = "does not match its recorded hash"
    _discard(path, f"{path.name} {what}")
    return None


def _discard(path: Path, message: str, warn: bool = True) -> None:
    for p in (path, _digest_path(path)):
        with contextlib.suppress(OSError):
            p.unlink()
    report(f"{message}: discarded and rebuilt", warn=warn)


def usable_entry(path: Path, key: str) -> bool:
    """An entry is used only when its bytes match the sidecar published with it, for ``key``."""
    return _checked_bytes(path, key) is not None


def _publish(data: bytes, path: Path, key: str, mode: int = 0o600) -> None:
    """Atomically publish an entry and its sidecar (the sidecar last: an entry is complete
    when its sidecar is there), each staged in a file of its own (``O_EXCL``, a random name,
    ``mode`` whatever the umask). Raises ``OSError``; nothing staged is left behind."""
    publish_bytes(path, data, mode)
    publish_bytes(_digest_path(path), _sidecar(data, key))


def publish_library(data: bytes, path: Path, key: str) -> None:
    """:func:`_publish` for a shared library (mode ``0700``)."""
    _publish(data, path, key, LIBRARY_MODE)


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
        try:
            publish_library(
                out.read_bytes(),
                private_subdir(u.path.parent.parent, u.key[:2]) / u.path.name,
                u.key,
            )
        except OSError as exc:  # NOTE: a cache that cannot be written costs the cache only
            report(
                f"could not keep kernels in {u.path.parent} ({exc})",
                once=UNUSABLE,
            )
            u.path = out
            u.lib = _load(u)  # NOTE: loaded before tmp goes; the mapping outlives the file
    u.seconds = time.perf_counter() - start

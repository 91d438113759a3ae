"""Compiled Triton kernels carried between machines: the files of Triton's on-disk cache that a
program's kernels load from, gathered at export and laid out again at a trusted load.

Triton keys each compiled kernel by its source, options, compile-affecting environment, Triton
build, ``ptxas`` and GPU architecture, and stores it as a *group* in ``<cache>/<key>/``: the
metadata JSON, the binary (``.cubin``/``.hsaco``) and ``__grp__<name>.json`` listing them by
absolute path. Each kernel's launcher is a C module in ``<cache>/<key>/`` too, built by the C
compiler on first use. A program's kernels therefore load without any compiler when such a
cache holds their groups and launchers under the keys this machine computes:

- :func:`gather` compiles ``kernels`` into an empty private cache (fresh module instances, so
  no kernel is served from memory) and returns that cache's files: each group's metadata and
  binary, each launcher module. The group lists are not carried (they hold absolute paths).
- :func:`lay_out` writes carried files into a private directory, each group's list rewritten to
  point there.
- :func:`serving` points Triton's cache at that directory while a program is built and returns
  which keys were built there anyway (a key this machine computes differently: another Triton
  build or ``ptxas``), which the load reports.

Triton's cache directory is process-wide: while :func:`serving` or :func:`gather` runs, a
Triton compile on another thread of the process also uses the private directory (it is built
there and not kept). Triton's own runtime module (``cuda_utils``, built once per Triton
install) is not carried.

Example:
    >>> files = {"ABC/k.json": b"{}", "ABC/k.cubin": b"\\x00", "DEF/__triton_launcher.so": b""}
    >>> [e["dir"] for e in entries(files)]
    ['ABC', 'DEF']
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from plait.codegen.errors import CodegenError
from plait.codegen.triton_text import TritonSource
from plait.errors import InternalValueError

BINARY_SUFFIXES = (".cubin", ".hsaco")
_LOCK = threading.Lock()  # NOTE: one private cache in use at a time in this process


def target_record() -> dict[str, Any]:
    """What a carried kernel is matched by besides its cache key: the Triton version and the
    current device's target (backend, architecture, warp size)."""
    import triton
    from triton.runtime import driver

    t = driver.active.get_current_target()
    return {
        "triton": triton.__version__,
        "backend": t.backend,
        "arch": str(t.arch),
        "warp_size": int(t.warp_size),
    }


def supported() -> str | None:
    """None when this Triton can serve kernels from a private cache; else why not."""
    try:
        from triton import knobs
    except ImportError:
        return "this Triton has no knobs (Triton >= 3.4 carries compiled kernels)"
    if not (hasattr(knobs.cache, "dir") and hasattr(knobs.cache, "scope")):
        return "this Triton's cache directory cannot be set for a while and restored"
    return None


@contextmanager
def _cache_at(folder: Path) -> Iterator[None]:
    from triton import knobs

    # NOTE: the knob's scope restores its value and TRITON_CACHE_DIR, which setting it exports
    with _LOCK, knobs.cache.scope():
        knobs.cache.dir = str(folder)
        yield


def gather(
    kernels: Sequence[tuple[TritonSource, Sequence[Any]]], device: Any, jobs: int, folder: Path
) -> dict[str, bytes]:
    """``kernels`` (as :func:`plait.codegen.triton_load.precompile` takes them) compiled for
    CUDA ``device`` into the empty private directory ``folder``, their launchers built; returns
    the files to carry, by path relative to ``folder``: each group's metadata JSON and binary,
    each launcher module."""
    from plait.codegen.triton_load import precompile

    with _cache_at(folder):
        record = precompile(kernels, device, jobs, fresh=True)
    if "error" in record:
        raise CodegenError(f"the Triton kernels did not compile ahead: {record['error']}")
    return cache_files(folder)


def cache_files(folder: Path) -> dict[str, bytes]:
    """The files of Triton cache ``folder`` a load needs, by ``<key>/<name>``: each kernel
    group's metadata JSON and binary (not its IR texts), each launcher module (a key with no
    group)."""
    files: dict[str, bytes] = {}
    for entry in sorted(p for p in folder.iterdir() if p.is_dir()):
        group = _group_names(entry)
        for path in sorted(p for p in entry.iterdir() if p.is_file()):
            keep = (
                path.name in group and path.suffix in (".json", *BINARY_SUFFIXES)
                if group
                else path.suffix == ".so"
            )
            if keep:
                files[f"{entry.name}/{path.name}"] = path.read_bytes()
    return files


def _group_names(entry: Path) -> set[str]:
    """The files a kernel group in cache directory ``entry`` lists (empty: not a group)."""
    names: set[str] = set()
    for grp in entry.glob("__grp__*.json"):
        doc = json.loads(grp.read_text())
        names.update(Path(p).name for p in doc.get("child_paths", {}).values())
    return names


def entries(files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """The index entries of carried ``files`` (``<key>/<name>`` each): per cache key, its file
    names and, for a kernel group, the metadata file that names the group."""
    by_dir: dict[str, list[str]] = {}
    for rel in files:
        key, name = rel.split("/")
        by_dir.setdefault(key, []).append(name)
    out = []
    for key, names in sorted(by_dir.items()):
        binaries = [n for n in names if n.endswith(BINARY_SUFFIXES)]
        metadata = [n for n in names if n.endswith(".json")]
        group = metadata[0] if len(binaries) == 1 and len(metadata) == 1 else None
        if group is None and not all(n.endswith(".so") for n in names):
            raise InternalValueError(
                f"Triton cache key {key} is neither a kernel nor a launcher: {names}"
            )
        out.append({"dir": key, "files": sorted(names), "group": group})
    return out


def lay_out(carried: Sequence[tuple[dict[str, Any], Mapping[str, bytes]]], folder: Path) -> None:
    """Each entry's files (name -> bytes) written to ``folder/<key>/``; a kernel group's list
    (``__grp__<metadata>``) written with the paths there."""
    for entry, data in carried:
        home = folder / entry["dir"]
        home.mkdir(mode=0o700)
        paths = {}
        for name, blob in data.items():
            (home / name).write_bytes(blob)
            paths[name] = str(home / name)
        if entry["group"] is not None:
            listing = json.dumps({"child_paths": paths})
            (home / f"__grp__{entry['group']}").write_text(listing)


@contextmanager
def serving(folder: Path) -> Iterator[list[str]]:
    """Triton's cache pointed at ``folder`` (laid out by :func:`lay_out`) for the block; the
    yielded list is filled, on exit, with the cache keys built there during the block (a
    kernel or launcher whose carried files this machine did not find under its own key)."""
    built: list[str] = []
    before = {p.name for p in folder.iterdir()}
    try:
        with _cache_at(folder):
            yield built
    finally:
        # NOTE: a lookup that misses makes its key's directory too: built is what holds files
        fresh = [p for p in folder.iterdir() if p.name not in before and p.is_dir()]
        built.extend(sorted(p.name for p in fresh if any(p.iterdir())))

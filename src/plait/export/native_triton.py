"""Ahead-of-time Triton kernels: the compiled kernels and launchers a CUDA artifact carries
(:mod:`plait.codegen.triton_carry`), their index, and whether a load uses them.

The index (``native/index.json`` with ``"kind": "triton"``) records the Triton version and GPU
target they were compiled for and, per Triton cache key, its files (``native/triton/<key>/<name>``)
with their SHA-256. A trusted load on a matching Triton and GPU lays them out as a private Triton
cache for the build, which then compiles nothing; a key this machine computes differently (another
Triton build, another ``ptxas``) is compiled here and the load says so.

Example:
    >>> check_target({"triton": "3.6.0", "backend": "cuda", "arch": "90", "warp_size": 32})
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from plait.codegen.errors import CodegenError
from plait.errors import ArtifactFormatError
from plait.export.archive import Members, claim, sha256
from plait.export.native import INDEX

PREFIX = "native/triton/"
_DIR = re.compile(r"[A-Z2-7]{1,104}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_SUFFIXES = (".json", ".cubin", ".hsaco", ".so")
_TARGET = {"triton": str, "backend": str, "arch": str, "warp_size": int}


def collect(program: Any) -> tuple[dict[str, bytes], dict[str, Any] | None, str]:
    """The members carrying ``program``'s compiled Triton kernels and launchers (compiled
    again into a private cache to gather them) and their index; or none, and why."""
    import torch

    from plait.codegen import triton_carry
    from plait.codegen.fusion import graph_device
    from plait.ir.private_files import fresh_private_dir
    from plait.runtime.kernel_targets import triton_launches

    why = triton_carry.supported()
    if why is not None:
        return {}, None, f"no native kernels: {why}"
    launches = triton_launches(program.plan, program.kernels)
    if not launches:
        return {}, None, "no native kernels: the program has no kernel"
    device = graph_device(program.graph)
    folder = fresh_private_dir("plait-export-triton-")
    try:
        with torch.cuda.device(device):
            target = triton_carry.target_record()
        jobs = program.options.jobs or os.cpu_count() or 1
        files = triton_carry.gather(launches, device, jobs, folder)
    except CodegenError as exc:  # NOTE: the export carries none, and says why
        return {}, None, f"no native kernels: {exc}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    entries = []
    for entry in triton_carry.entries(files):
        names = entry["files"]
        blobs = [files[f"{entry['dir']}/{n}"] for n in names]
        entry["files"] = [{"name": n, "sha256": sha256(b)} for n, b in zip(names, blobs)]
        entries.append(entry)
    members = {f"{PREFIX}{rel}": data for rel, data in files.items()}
    index = {"kind": "triton", "target": target, "entries": entries}
    kernels = sum(e["group"] is not None for e in entries)
    note = f"{kernels} Triton kernels and {len(entries) - kernels} launchers for {_name(target)}"
    return members, index, note


def _name(target: dict[str, Any]) -> str:
    return f"Triton {target['triton']} on {target['backend']} arch {target['arch']}"


def check_target(target: Any) -> None:
    """Raises :class:`ArtifactFormatError` unless ``target`` is a target record."""
    ok = isinstance(target, dict) and set(target) == set(_TARGET)
    if not ok or not all(type(target[k]) is t for k, t in _TARGET.items()):
        raise ArtifactFormatError(f"{INDEX}: target {str(target)[:120]!r} is malformed")


def read_index(doc: dict[str, Any], members: Members) -> set[str]:
    """Checks a Triton index against the members it declares (names, SHA-256, one group file
    per kernel); returns the declared member names."""
    check_target(doc.get("target"))
    entries = doc.get("entries")
    if not isinstance(entries, list) or not entries:
        raise ArtifactFormatError(f"{INDEX}: no 'entries' list")
    declared: set[str] = set()
    dirs: set[str] = set()
    for e in entries:
        files = e.get("files") if isinstance(e, dict) else None
        if not isinstance(files, list):
            raise ArtifactFormatError(f"{INDEX}: entry {str(e)[:80]!r} has no files")
        ok = (
            len(files) > 0
            and "group" in e
            and isinstance(e.get("dir"), str)
            and _DIR.fullmatch(e["dir"]) is not None
            and all(_file_ok(f) for f in files)
        )
        if not ok:
            raise ArtifactFormatError(f"{INDEX}: entry {str(e)[:80]!r} is malformed")
        if e["dir"] in dirs:
            raise ArtifactFormatError(f"{INDEX}: key {e['dir'][:16]} has two entries")
        dirs.add(e["dir"])
        names = [f["name"] for f in files]
        group = e["group"]
        if group is not None and (group not in names or not group.endswith(".json")):
            raise ArtifactFormatError(f"{INDEX}: entry {e['dir'][:16]} names no group")
        if group is None and not all(n.endswith(".so") for n in names):
            raise ArtifactFormatError(f"{INDEX}: entry {e['dir'][:16]} is not a launcher")
        for f in files:
            claim(members, f"{PREFIX}{e['dir']}/{f['name']}", f["sha256"], declared, INDEX)
    return declared


def _file_ok(f: Any) -> bool:
    return (
        isinstance(f, dict)
        and isinstance(f.get("name"), str)
        and _NAME.fullmatch(f["name"]) is not None
        and not f["name"].lower().startswith("__grp__")  # NOTE: a case-blind file system too
        and f["name"].endswith(_SUFFIXES)
        and isinstance(f.get("sha256"), str)
    )


def mismatch(index: dict[str, Any], device: Any) -> str | None:
    """Why this machine cannot use the carried kernels (another Triton version or GPU target;
    no Triton; no CUDA), or None."""
    try:
        import torch

        from plait.codegen import triton_carry

        why = triton_carry.supported()
        if why is not None:
            return why
        with torch.cuda.device(device):
            here = triton_carry.target_record()
    except Exception as exc:  # NOTE: no Triton, no CUDA: the load says so and builds
        return f"no Triton target here ({type(exc).__name__}: {exc})"
    recorded = index["target"]
    differ = sorted(k for k in recorded if here.get(k) != recorded[k])
    if differ:
        return (
            f"they were compiled for {_name(recorded)}, this machine has {_name(here)} "
            f"({', '.join(differ)} differ)"
        )
    return None


def lay_out(entries: list[dict[str, Any]], members: Members, workdir: Path) -> None:
    """The carried files written to ``workdir`` as a private Triton cache."""
    from plait.codegen import triton_carry

    carried = [
        (e, {f["name"]: members.read(f"{PREFIX}{e['dir']}/{f['name']}") for f in e["files"]})
        for e in entries
    ]
    triton_carry.lay_out(carried, workdir)

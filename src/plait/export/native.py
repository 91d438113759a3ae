"""Ahead-of-time native kernels: the C++ kernel libraries an artifact may carry, and the trust
model that decides whether a load uses them.

A library is code. An artifact's libraries are loaded only when the load names the artifact's
digest as trusted (``plait.load(path, trust="sha256:...")``; the digest covers every member,
libraries included), and only when this machine's toolchain is the one they were built with
(compiler, version, flags and CPU features: what the kernel cache keys a library by). Each is
then written to a private temporary directory of the load, loaded with ctypes as the kernel
unit it was built for, and the directory removed: the Stax build finds every unit loaded and
runs no compiler. Otherwise nothing of them is written or loaded; the kernels are printed from
the program's IR and built here (the kernel cache's usual path), and the load says why. A CUDA
program's compiled Triton kernels follow the same rule (:mod:`plait.export.native_triton`).

Example:
    >>> decide_native(None, None, "sha256:" + "0" * 64).status
    'none'
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.errors import ArtifactFormatError, ArtifactTrustError, InvalidOptionError
from plait.export.archive import Members, claim, sha256

INDEX = "native/index.json"
# NOTE: a Stax kernel's symbol, or the C entry of one of csrc's native kernels
_SYMBOL = re.compile(r"stax_[0-9a-f]{24}|plait_[a-z0-9_]{1,80}")
_KEY = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass
class NativeDecision:
    """What a load does with an artifact's native kernels: ``status`` is ``"none"`` (it carries
    none), ``"loaded"`` (trusted and built for this toolchain) or ``"rebuilt"`` (built here
    from the IR), with the ``reason``; ``jobs``: the unit grouping to rebuild the program with
    (the exporter's, so that each unit's key is the one its library was built for)."""

    status: str
    reason: str
    units: list[dict[str, Any]] = field(default_factory=list)
    jobs: int | None = None
    kind: str = "cpp"
    workdir: Path | None = None  # NOTE: Triton's: the private cache the build is served from

    def record(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "units": len(self.units)}


def collect(program: Any) -> tuple[dict[str, bytes], dict[str, Any] | None, str]:
    """The members carrying ``program``'s kernel libraries (a StaxProgram, from the kernel
    cache) and their index; or none, and why."""
    from plait.codegen import build
    from plait.codegen.errors import BuildError
    from plait.manifest import cpu_features

    if program is not None and getattr(program, "target", None) == "triton":
        from plait.export import native_triton

        return native_triton.collect(program)
    if program is None or getattr(program, "target", None) != "cpu":
        return {}, None, "no native kernels: the program is not a Stax or Triton program"
    by_unit: dict[str, dict[str, str]] = {}
    for k in program.kernels:
        by_unit.setdefault(k.unit, {})[k.symbol] = k.source
    entries, missing = _entry_units(program)
    if missing:
        return {}, None, f"no native kernels: entry {missing} was not built in this process"
    if not by_unit and not entries:
        return {}, None, "no native kernels: the program has no kernel"
    members: dict[str, bytes] = {}
    units = []
    for prefix, sources in sorted(by_unit.items()):
        symbols = sorted(sources)  # NOTE: a unit's kernels in the order it was built with
        if not all(sources.values()):  # NOTE: a TVM kernel: a library of TVM's own
            return {}, None, f"no native kernels: unit {prefix} is not a C++ kernel unit"
        try:
            path = build.unit_file(symbols, [sources[s] for s in symbols])
        except BuildError as exc:
            return {}, None, f"no native kernels: unit {prefix} is not in the kernel cache ({exc})"
        if not path.stem.startswith(prefix):
            return {}, None, f"no native kernels: unit {prefix}'s kernels make another unit here"
        data = path.read_bytes()
        key = path.stem
        members[f"native/{key}.so"] = data
        units.append({"key": key, "symbols": symbols, "sha256": sha256(data)})
    for names, text in entries:
        try:
            path = build.unit_file(names, [text])
        except BuildError as exc:
            return {}, None, f"no native kernels: entry {names[0]}'s unit is not cached ({exc})"
        data = path.read_bytes()
        members[f"native/{path.stem}.so"] = data
        units.append({"key": path.stem, "symbols": list(names), "sha256": sha256(data)})
    tc = build.toolchain()
    index = {
        "toolchain": tc.key_parts(),
        "libmvec": tc.libmvec,
        "cpu": dict(cpu_features()),
        "units": units,
    }
    return members, index, f"{len(units)} native kernel libraries for this toolchain"


def _entry_units(program: Any) -> tuple[list[tuple[tuple[str, ...], str]], str | None]:
    """The units of csrc's native kernels (a 1x1, depthwise or stem convolution's, a linear's
    of few rows) that ``program``'s extern calls call, each once, in the order of its steps,
    and the launcher's where its runner runs them as one call; and an entry whose unit this
    process did not build, if any."""
    from plait.codegen.native_entries import unit_of
    from plait.codegen.native_launch import SYMBOL
    from plait.runtime.native_run import NativeRun

    found: dict[tuple[str, ...], str] = {}
    names = [
        n for s in program.plan.steps for n in getattr(getattr(s, "call", None), "entries", ())
    ]
    if any(isinstance(v, NativeRun) for v in program.runner.globals.values()):
        names.append(SYMBOL)  # NOTE: the runner runs its native calls through the launcher
    for name in names:
        unit = unit_of(name)
        if unit is None:
            return [], name
        found.setdefault(unit[0], unit[1])
    return list(found.items()), None


def trusted_digests(trust: str | Iterable[str] | None) -> frozenset[str] | None:
    """The digests a load trusts (``sha256:<hex>``), checked; None: none."""
    if trust is None:
        return None
    items = [trust] if isinstance(trust, str) else list(trust)
    out = set()
    for item in items:
        text = str(item).strip().lower()
        if _KEY.fullmatch(text):
            text = f"sha256:{text}"
        if not _DIGEST.fullmatch(text):
            raise InvalidOptionError(
                f"trust= takes artifact digests 'sha256:<64 hex digits>', got {item!r}"
            )
        out.add(text)
    return frozenset(out)


def read_index(members: Members) -> dict[str, Any] | None:
    """The native index, checked against the library members (each declared once, each with
    its bytes' SHA-256, symbols that are kernel symbols; a Triton index's files, see
    :mod:`plait.export.native_triton`); None when there is none. Any library or ``native/``
    member the index does not declare is refused."""
    libraries = {n for n in members.data if n.endswith(".so") or n.startswith("native/")}
    libraries.discard(INDEX)
    if not members.has(INDEX):
        if libraries:
            raise ArtifactFormatError(f"native libraries {sorted(libraries)} with no {INDEX}")
        return None
    doc = members.json(INDEX)
    if isinstance(doc, dict) and doc.get("kind") == "triton":
        from plait.export import native_triton

        _refuse_planted(libraries - native_triton.read_index(doc, members))
        return doc
    if isinstance(doc, dict) and doc.get("kind", "cpp") != "cpp":
        raise ArtifactFormatError(f"{INDEX}: unknown kind {str(doc.get('kind'))[:40]!r}")
    units = doc.get("units") if isinstance(doc, dict) else None
    if not isinstance(units, list) or not isinstance(doc.get("toolchain"), dict):
        raise ArtifactFormatError(f"{INDEX}: no 'units' list or 'toolchain' object")
    declared: set[str] = set()
    for u in units:
        ok = (
            isinstance(u, dict)
            and isinstance(u.get("key"), str)
            and _KEY.fullmatch(u["key"]) is not None
            and isinstance(u.get("symbols"), list)
            and len(u["symbols"]) > 0
            and all(isinstance(s, str) and _SYMBOL.fullmatch(s) for s in u["symbols"])
            and isinstance(u.get("sha256"), str)
        )
        if not ok:
            raise ArtifactFormatError(f"{INDEX}: unit {str(u)[:80]!r} is malformed")
        claim(members, f"native/{u['key']}.so", u["sha256"], declared, INDEX)
    _refuse_planted(libraries - declared)
    return doc


def _refuse_planted(undeclared: set[str]) -> None:
    if undeclared:
        raise ArtifactFormatError(
            f"native libraries {sorted(undeclared)} are not declared in {INDEX}"
        )


def decide_native(
    index: Mapping[str, Any] | None,
    trusted: frozenset[str] | None,
    digest: str,
    device: Any = None,
) -> NativeDecision:
    """Whether the artifact's kernels are loaded (see the module doc). Raises
    :class:`ArtifactTrustError` when ``trusted`` names digests and this artifact's is not one."""
    if trusted is not None and digest not in trusted:
        raise ArtifactTrustError(
            f"the artifact's digest is {digest}; the load trusts {sorted(trusted)}: it was "
            "changed, or is another artifact"
        )
    if index is None:
        return NativeDecision("none", "the artifact carries no native kernels")
    if index.get("kind") == "triton":
        return _decide_triton(index, trusted, digest, device)
    units = list(index["units"])
    if trusted is None:
        return NativeDecision(
            "rebuilt",
            "kernels built here from the IR: the artifact's native kernels are code, loaded only "
            f"when its digest is trusted (plait.load(path, trust={digest!r}))",
            units,
        )
    from plait.codegen import build
    from plait.codegen.errors import BuildError

    try:
        here = build.toolchain().key_parts()
    except BuildError as exc:
        return NativeDecision("rebuilt", f"kernels built here: no toolchain to match ({exc})")
    recorded = index["toolchain"]
    differ = sorted(k for k in set(here) | set(recorded) if here.get(k) != recorded.get(k))
    if differ:
        what = ", ".join(differ)
        return NativeDecision(
            "rebuilt",
            f"kernels built here from the IR: the artifact's were built with another toolchain "
            f"or CPU ({what} differ)",
            units,
        )
    return NativeDecision(
        "loaded", f"{len(units)} native kernel libraries trusted by digest {digest}", units,
        len(units),
    )  # fmt: skip


def _decide_triton(
    index: Mapping[str, Any], trusted: frozenset[str] | None, digest: str, device: Any
) -> NativeDecision:
    from plait.export import native_triton

    entries = list(index["entries"])
    if trusted is None:
        return NativeDecision(
            "rebuilt",
            "Triton kernels compiled here from the IR: the artifact's compiled kernels are code, "
            f"loaded only when its digest is trusted (plait.load(path, trust={digest!r}))",
            entries,
            kind="triton",
        )
    why = native_triton.mismatch(dict(index), device)
    if why is not None:
        return NativeDecision(
            "rebuilt", f"Triton kernels compiled here from the IR: {why}", entries, kind="triton"
        )
    kernels = sum(e["group"] is not None for e in entries)
    return NativeDecision(
        "loaded",
        f"{kernels} Triton kernels and {len(entries) - kernels} launchers trusted by digest "
        f"{digest}",
        entries,
        kind="triton",
    )


def adopt(decision: NativeDecision, members: Members, workdir: Path) -> None:
    """Load the trusted libraries (``decision.status == "loaded"``) as their kernel units,
    each written to ``workdir`` (the load's private temporary directory), removed after. Trusted
    Triton kernels are laid out in ``workdir`` as the private cache the build is served from
    (``decision.workdir``; the build removes it)."""
    from plait.codegen import build

    if decision.kind == "triton":
        from plait.export import native_triton

        try:
            native_triton.lay_out(decision.units, members, workdir)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        decision.workdir = workdir
        return
    try:
        for u in decision.units:
            path = workdir / f"{u['key']}.so"
            path.write_bytes(members.read(f"native/{u['key']}.so"))
            path.chmod(0o700)
            build.adopt_library(u["key"], path, u["symbols"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def check_adopted(
    decision: NativeDecision, program: Any, triton_built: list[str] | None = None
) -> NativeDecision:
    """After the build: every kernel came from a trusted library, or the decision says which
    were built here (``triton_built``: the Triton cache keys compiled during the build)."""
    if decision.status != "loaded":
        return decision
    if decision.kind == "triton":
        if not triton_built:
            return decision
        return NativeDecision(
            "rebuilt",
            f"{decision.reason}; but {len(triton_built)} Triton kernels or launchers of this "
            "build were compiled here (this machine keys them differently: another Triton build "
            "or ptxas)",
            decision.units,
            kind="triton",
        )
    carried = {u["key"][:16] for u in decision.units}
    built = sorted({k.unit for k in program.kernels if k.unit not in carried})
    if built:
        return NativeDecision(
            "rebuilt",
            f"{decision.reason}; but units {built} of this build were not among them and were "
            "built here",
            decision.units,
        )
    return decision

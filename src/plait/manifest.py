"""The compile manifest: one JSON document per compiled specialization.

It records the source semantic hash (minted at capture, carried here), the options, the
toolchain, every pass with its rewrites, guards, fallbacks with reasons, kernel and executor
choices, cache key parts, and — in a separate top-level section — timings. Everything outside
``timings`` is deterministic: two compiles of the same model give identical documents.

Example:
    >>> m = Manifest(source_hash="ab" * 32, options={"backend": "eager"})
    >>> m.passes.append({"name": "dce", "changed": False, "rewrites": [], "details": {}})
    >>> Manifest.from_json(m.to_json()).deterministic() == m.deterministic()
    True
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plait.codegen.build import cpu_info
from plait.errors import StoreFormatError
from plait.ir.private_files import read_regular

SCHEMA = "plait.manifest/1"


@functools.lru_cache(maxsize=1)
@functools.cache
def cpu_features() -> dict[str, Any]:
    """The CPU's architecture, model and a hash of its feature flags (native code is built with
    ``-march=native``; oneDNN picks kernels by them). Read once per process."""
    model, flags = cpu_info()
    return {
        "machine": platform.machine(),
        "model": model or platform.machine(),
        "flags_sha256": hashlib.sha256(flags.encode()).hexdigest(),
    }


def toolchain(extra: dict[str, str] | None = None) -> dict[str, Any]:
    """Versions of everything that shaped the compiled artifact."""
    import torch

    from plait import __version__

    out: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "plait": __version__,
        "cpu": dict(cpu_features()),
    }
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    # NOTE: only where this process already uses CUDA: asking starts the driver (~0.2 s).
    if torch.cuda.is_initialized():
        out["gpu_capability"] = list(torch.cuda.get_device_capability())
    out.update(extra or {})
    return out


def printable(text: str) -> str:
    """``text`` safe for a terminal: every control character but the newline (an escape
    sequence, a carriage return, a bidirectional override) written as its Python escape.

    Example:
        >>> printable("ok\\x1b[2Jgone")
        'ok\\\\x1b[2Jgone'
    """
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if _unsafe(ch) else ch for ch in text
    )


def _unsafe(ch: str) -> bool:
    return ch != "\n" and unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


MAX_BYTES = 1 << 30  # NOTE: a manifest file larger than this is refused, not read

# NOTE: the stages a specialization's compile spent time in (timings, seconds), and where a
# measured break-even sits among the timings (``plait.diagnose.break_even`` writes it there)
COMPILE_STAGES = ("capture", "passes", "backend")
BREAK_EVEN = "break_even."


def describe_break_even(compile_s: float, eager_s: float, compiled_s: float) -> str:
    """A compile weighed against its saving per call, in words.

    Example:
        >>> describe_break_even(0.5, 0.003, 0.001)
        'compile 0.500 s; a call 3.000 ms eager, 1.000 ms compiled: pays for itself after 250 calls'
    """
    saving = eager_s - compiled_s
    when = f"pays for itself after {compile_s / saving:.0f} calls" if saving > 0 else "never pays"
    return (
        f"compile {compile_s:.3f} s; a call {eager_s * 1e3:.3f} ms eager, "
        f"{compiled_s * 1e3:.3f} ms compiled: {when}"
    )


@dataclass
class Manifest:
    source_hash: str
    options: dict[str, Any] = field(default_factory=dict)
    toolchain: dict[str, Any] = field(default_factory=toolchain)
    passes: list[dict[str, Any]] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    kernels: dict[str, Any] = field(default_factory=dict)
    executor: dict[str, Any] = field(default_factory=dict)
    cache_key: dict[str, Any] = field(default_factory=dict)
    graph: dict[str, Any] = field(default_factory=dict)
    # NOTE: a compiled backward: the partition (partitioner, saved tensors and their bytes,
    # recomputed nodes) and what a gradient is computed for; empty for inference
    autograd: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # NOTE: how this process got the artifact (hit, miss and why, corrupt entries replaced):
    # a fact about the cache's state, not the compile, so outside deterministic() like timings.
    cache: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source_hash": self.source_hash,
            "options": self.options,
            "toolchain": self.toolchain,
            "passes": self.passes,
            "guards": self.guards,
            "fallbacks": self.fallbacks,
            "kernels": self.kernels,
            "executor": self.executor,
            "cache_key": self.cache_key,
            "graph": self.graph,
            "autograd": self.autograd,
            "timings": self.timings,
            "cache": self.cache,
        }

    def deterministic(self) -> dict[str, Any]:
        """Everything but the timings: equal across compiles of the same program."""
        out = self.to_json()
        del out["timings"], out["cache"]
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True, default=str)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps() + "\n")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """The manifest ``data`` describes; raises ``ValueError`` naming what is wrong when it
        is not a plait manifest (not an object, another schema, a field of the wrong type)."""
        if not isinstance(data, dict):
            raise StoreFormatError(
                f"not a plait manifest (a JSON {type(data).__name__}, not an object)"
            )
        if data.get("schema") != SCHEMA:
            raise StoreFormatError(
                f"not a plait manifest (schema {data.get('schema')!r}, expected {SCHEMA!r})"
            )
        fields = {k: v for k, v in data.items() if k != "schema"}
        for name, value in fields.items():
            kind = _FIELD_TYPES.get(name)
            if kind is None:
                raise StoreFormatError(f"not a plait manifest: unknown field {name!r}")
            if not isinstance(value, kind):
                raise StoreFormatError(
                    f"not a plait manifest: {name!r} is a {type(value).__name__}, "
                    f"expected a {kind.__name__}"
                )
        if "source_hash" not in fields:
            raise StoreFormatError("not a plait manifest: no 'source_hash'")
        return cls(**fields)

    @classmethod
    def load(cls, path: str | Path) -> Manifest:
        """The manifest saved at ``path``. Raises ``OSError`` where it cannot be read (a FIFO,
        a device or a directory is refused, never read) and ``ValueError`` naming what is wrong
        with a file that is not a plait manifest (not UTF-8 JSON, nested too deep, a field of
        the wrong type)."""
        data = read_regular(path, limit=MAX_BYTES)
        try:
            doc = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise StoreFormatError(
                f"not a plait manifest: not UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
        except RecursionError:
            raise StoreFormatError("not a plait manifest: JSON nested too deep") from None
        return cls.from_json(doc)

    def report(self) -> str:
        """A readable report: passes and rewrites, fallbacks, guards, executor counts."""
        lines = [
            f"manifest for program {self.source_hash[:16]}…",
            f"  options: {json.dumps(self.options, sort_keys=True, default=str)}",
        ]
        lines.append("  passes:")
        lines.append(f"    {'pass':<14} {'changed':<8} {'rewrites':>8}  rules")
        for p in self.passes:
            counts: dict[str, int] = {}
            for r in p.get("rewrites", []):
                counts[r["rule"]] = counts.get(r["rule"], 0) + 1
            rules = ", ".join(f"{k}×{v}" for k, v in sorted(counts.items())) or "-"
            lines.append(
                f"    {p['name']:<14} {p['changed']!s:<8} {len(p.get('rewrites', [])):>8}  {rules}"
            )
        lines.append(f"  fallbacks: {len(self.fallbacks)}")
        lines += [f"    - {f.get('what', '?')}: {f.get('reason', '?')}" for f in self.fallbacks]
        lines.append(f"  guards: {len(self.guards)}")
        lines += [f"    - {g}" for g in self.guards]
        if self.executor:
            counts = self.executor.get("evidence", {}).get("counts", {})
            memory = self.executor.get("memory_plan", {})
            line = f"  executor: {self.executor.get('backend', '?')}"
            if counts:
                line += " — " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)
            peak = memory.get("peak_live_bytes")
            if isinstance(peak, (int, float)):
                line += f"; peak live {peak / 2**20:.1f} MiB"
            elif peak is not None:  # NOTE: a symbolic program's plan: "per call"
                line += f"; peak live {peak}"
            lines.append(line)
        for r in self.executor.get("regions", []):
            backends = f" ({', '.join(r['backends'])})" if r.get("backends") else ""
            lines.append(f"    region {r['module']} [{r['class']}]: {r['status']}{backends}")
        for b in self.executor.get("boundaries", []):
            # NOTE: a capture error's reason starts with its file:line
            lines.append(f"    boundary {b['module'] or '<root>'}: {b['reason']}")
        if self.kernels.get("kernels"):
            lines.append(f"  kernels: {len(self.kernels['kernels'])} native")
        if self.cache_key.get("digest"):
            lines.append(f"  cache key: {self.cache_key['digest'][:16]}…")
        if self.cache:
            lines.append(f"  cache: {self.cache.get('status', '?')}")
            if self.cache.get("miss"):
                lines.append(f"    - {self.cache['miss']}")
            lines += [f"    - {e}" for e in self.cache.get("events", [])]
        stages = {k: v for k, v in self.timings.items() if not k.startswith(BREAK_EVEN)}
        if stages:
            total = sum(v for v in stages.values() if isinstance(v, (int, float)))
            lines.append(f"  timings: {total * 1e3:.1f} ms over {len(stages)} entries")
        lines.append(f"  break-even: {self._break_even()}")
        return "\n".join(lines)

    def _break_even(self) -> str:
        t = self.timings
        eager, fast = t.get(BREAK_EVEN + "eager_call_s"), t.get(BREAK_EVEN + "compiled_call_s")
        if eager is None or fast is None:
            return "not measured (plait.diagnose.break_even(compiled, args) measures it)"
        compile_s = sum(float(t.get(k, 0.0)) for k in COMPILE_STAGES)
        calls = int(t.get(BREAK_EVEN + "calls", 0))
        return f"{describe_break_even(compile_s, eager, fast)} (medians of {calls} calls)"


# NOTE: each field's JSON type: a loaded manifest is checked against it, field by field
_FIELD_TYPES: dict[str, type] = {
    "source_hash": str,
    "autograd": dict,
    "options": dict,
    "toolchain": dict,
    "passes": list,
    "guards": list,
    "fallbacks": list,
    "kernels": dict,
    "executor": dict,
    "cache_key": dict,
    "graph": dict,
    "timings": dict,
    "cache": dict,
}


@dataclass
class SpecializationReport:
    index: int
    reason: str | None  # None for the first specialization, else the guards that failed
    guards: list[str]
    manifest: Manifest
    # what checks the guards on each call: "native", or "python: <why not native>"
    guard_evaluator: str = "python"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "recompile_reason": self.reason,
            "guards": self.guards,
            "guard_evaluator": self.guard_evaluator,
            "manifest": self.manifest.to_json(),
        }


@dataclass
class Explanation:
    """What ``plait.explain(compiled)`` returns: each specialization with its guards, the
    reason it was compiled, and its manifest. ``str()`` is a readable report.

    ``regions`` (a module whose call could not be captured whole, ``fullgraph=False``): each
    region (``module`` path, ``class``, ``status``: how its latest calls ran, ``compiled``,
    ``split`` into its own regions, or ``eager``, with the ``reason`` when it is not compiled
    for one (hooks below it, an object argument, a refusal); ``calls``: how many ran
    ``compiled`` and how many ran ``split`` for such a reason; ``backends``,
    ``specializations``, the regions it shares its
    artifact with, its ``compiled_ops``, ``opaque_ops`` and ``eager_ops``), each boundary (the
    module, the capture error as ``reason``, its ``operation``, ``file`` and ``line``), the
    ``ops`` (``compiled_share``: IR nodes run in compiled regions over those plus opaque nodes
    plus ATen ops run eagerly, measured on the first call that runs them all), the ``sharing``
    counts of identical blocks and ``pending``: the modules (``""``, the root) whose call went
    on eagerly from a refused capture, their regions captured from their next call; None for a
    program captured whole."""

    name: str
    specializations: list[SpecializationReport]
    # on_recompile_limit="eager": why calls past the limit ran eagerly, and how many did
    limit_fallback: dict[str, Any] | None = None
    regions: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "specializations": [s.to_json() for s in self.specializations],
            "limit_fallback": self.limit_fallback,
            "regions": self.regions,
        }

    def __str__(self) -> str:
        if not self.specializations:
            return f"{self.name}: not compiled yet (it compiles on its first call)"
        lines = [f"{self.name}: {len(self.specializations)} specialization(s)"]
        for s in self.specializations:
            why = "first call" if s.reason is None else f"recompiled: {s.reason}"
            lines.append(f"[{s.index}] {why}")
            checked = f"checked by the {s.guard_evaluator} evaluator"
            lines.append(f"    {len(s.guards)} guards, {checked}")
            lines += ["    " + line for line in s.manifest.report().splitlines()]
        if self.limit_fallback is not None:
            lines.append(
                f"eager fallback past the recompile limit ({self.limit_fallback['calls']} "
                f"call(s)): {self.limit_fallback['reason']}"
            )
        if self.regions is not None:
            lines += describe_regions(self.regions)
        return "\n".join(lines)


def describe_regions(report: dict[str, Any]) -> list[str]:
    """``report`` (``plait.regions.RegionTree.report``) as readable lines."""
    ops = report["ops"]
    lines = ["regional compilation (the module's call could not be captured whole):"]
    if ops["measured"] and ops["compiled_share"] is not None:
        lines.append(
            f"  ops run compiled: {ops['compiled_share']:.1%} ({ops['compiled']} IR nodes in "
            f"compiled regions; {ops['opaque']} opaque nodes; {ops['eager']} ATen ops eagerly), "
            "measured on the first call that ran them all (again after a region's calls began "
            "to run another way)"
        )
    else:
        lines.append("  ops: not measured yet (the first call that runs the regions does)")
    lines.append(f"  regions: {len(report['regions'])}")
    for path in report.get("pending", ()):
        lines.append(
            f"    (regions of {path or '<root>'}: captured and compiled from its next call; the "
            "call whose capture was refused went on eagerly)"
        )
    for r in report["regions"]:
        how = r["status"]
        if r["backends"]:
            how += f" ({', '.join(r['backends'])})"
        line = f"    - {r['module'] or '<root>'} [{r['class']}]: {how}"
        if r.get("reason"):
            line += f" ({str(r['reason']).splitlines()[0]})"
        line += f", {r['specializations']} specialization(s)"
        if r["compiled_ops"] or r["eager_ops"]:
            line += f", {r['compiled_ops']} compiled / {r['eager_ops']} eager ops"
        if r["shares_artifact_with"]:
            line += f", shares its artifact with {', '.join(r['shares_artifact_with'])}"
        if r["not_shared"]:
            line += f", not shared: {r['not_shared'].splitlines()[0]}"
        lines.append(line)
    lines.append(f"  boundaries: {len(report['boundaries'])}")
    for b in report["boundaries"]:
        first = str(b["reason"]).splitlines()[0]  # NOTE: a capture error's starts with file:line
        lines.append(f"    - {b['module'] or '<root>'} [{b['class']}]: {first}")
    if report["sharing"]:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(report["sharing"].items()))
        lines.append(f"  region engines: {counts}")
    return lines

"""Cache keys: named parts, hashed as canonical JSON; and why a key missed.

A key is made of parts: the source semantic hash (minted at capture), the guards (what the
program's behaviour depended on, written the same way in every process), the target, the
options, the toolchain versions, the ambient settings and the hash of the frozen weights. Never a
file path, an mtime or source text. The digest is SHA-256 over the parts as canonical JSON (keys
sorted, no whitespace), so equal parts give equal keys in every process.

Example:
    >>> a = CacheKey({"source": "s1", "options": {"passes": "inference", "freeze": True}})
    >>> b = CacheKey({"source": "s1", "options": {"passes": "none", "freeze": True}})
    >>> a.digest == CacheKey(dict(a.parts)).digest, a.digest == b.digest
    (True, False)
    >>> explain_miss(b.parts, [(a.digest, a.parts)]).differs
    ['options.passes']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PART_NAMES = ("format", "source", "guards", "target", "options", "toolchain", "ambient", "weights")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def text_digest(canonical: str) -> str:
    """The key (hex SHA-256) of parts already written as :func:`canonical_json`."""
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """The parts of a key (JSON values) and their digest (hex SHA-256)."""

    parts: Mapping[str, Any]

    @property
    def digest(self) -> str:
        return text_digest(canonical_json(dict(self.parts)))


@dataclass
class MissExplanation:
    """Why a key missed: the nearest entry (most equal parts) and the parts that differ from it
    (``"options.passes"``, ``"guards[3]"``), each with a short ``was``/``now`` view."""

    nearest: str | None
    differs: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.nearest is None:
            return "no entry in the cache to compare with (an empty cache)"
        return f"nearest entry {self.nearest[:16]}… differs in: " + "; ".join(self.details)


def _short(value: Any, width: int = 72) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _diff(path: str, was: Any, now: Any) -> list[tuple[str, str]]:
    """The leaves that differ, as (path, description); one level into dicts and lists."""
    if was == now:
        return []
    if isinstance(was, Mapping) and isinstance(now, Mapping):
        out: list[tuple[str, str]] = []
        for k in sorted(set(was) | set(now), key=str):
            sub = f"{path}.{k}"
            if k not in was or k not in now:
                side = "only now" if k not in was else "only in the entry"
                out.append((sub, f"{sub}: {side}"))
            elif was[k] != now[k]:
                out.append((sub, f"{sub}: was {_short(was[k])}, now {_short(now[k])}"))
        return out
    if isinstance(was, list) and isinstance(now, list):
        for i, (a, b) in enumerate(zip(was, now)):
            if a != b:
                return [(f"{path}[{i}]", f"{path}[{i}]: was {_short(a)}, now {_short(b)}")]
        return [(path, f"{path}: {len(was)} items in the entry, {len(now)} now")]
    return [(path, f"{path}: was {_short(was)}, now {_short(now)}")]


def explain_miss(
    parts: Mapping[str, Any], entries: Iterable[tuple[str, Mapping[str, Any]]]
) -> MissExplanation:
    """Compare ``parts`` with the entry that shares most top-level parts (the first such in
    ``entries``, which a store lists most recently used first)."""
    best: tuple[int, str, Mapping[str, Any]] | None = None
    for key, other in entries:
        if not isinstance(other, Mapping):
            continue
        same = sum(other.get(k) == v for k, v in parts.items())
        if best is None or same > best[0]:
            best = (same, key, other)
    if best is None:
        return MissExplanation(None)
    _, key, other = best
    found: list[tuple[str, str]] = []
    order = {n: i for i, n in enumerate(PART_NAMES)}
    for name in sorted(set(parts) | set(other), key=lambda n: (order.get(n, len(order)), n)):
        found += _diff(name, other.get(name), parts.get(name))
    return MissExplanation(key, [p for p, _ in found], [d for _, d in found])

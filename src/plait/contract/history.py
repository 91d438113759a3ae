"""Tolerances only tighten: find every budget a new contract loosens relative to an old one.

A loosening is allowed only with a reason: a ``[[changelog]]`` entry that is new in the new
contract (absent from the old one) and whose ``changes`` names the key, exactly or as an
``fnmatch`` pattern such as ``"op.*.bfloat16.rtol"``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plait.contract.model import Contract

# NOTE: a larger number is looser for every numeric key compared here.
_NUMERIC = ("rtol", "atol")
_ACCUM_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64, "int64": 64}


@dataclass(frozen=True)
class Loosening:
    """One budget the new contract makes looser. ``reason`` is None when no entry explains it."""

    key: str
    old: Any
    new: Any
    reason: str | None

    def __str__(self) -> str:
        why = f"reason: {self.reason}" if self.reason else "NO changelog entry names this key"
        return f"{self.key}: {self.old!r} -> {self.new!r} ({why})"


def loosened(
    old: Contract | Mapping[str, Any], new: Contract | Mapping[str, Any]
) -> list[Loosening]:
    """Every key whose budget ``new`` loosens relative to ``old``, each with its reason or None.

    Accepts loaded contracts or raw parsed TOML mappings (so an old file that no longer passes
    today's validation can still be compared).

    Example:
        >>> old = {"model": {"floor": {"float32": 4.0}}, "changelog": []}
        >>> new = {"model": {"floor": {"float32": 5.0}}, "changelog": [
        ...     {"version": "1.1", "reason": "flaky on tiny tensors",
        ...      "changes": ["model.floor.float32"]}]}
        >>> [str(x) for x in loosened(old, new)]
        ['model.floor.float32: 4.0 -> 5.0 (reason: flaky on tiny tensors)']
    """
    old_data, new_data = _data(old), _data(new)
    old_keys, new_keys = budget_keys(old_data), budget_keys(new_data)
    fresh = _new_entries(old_data, new_data)
    out = []
    for key, old_value in old_keys.items():
        new_value = new_keys.get(key, _REMOVED)
        if new_value is _REMOVED or _looser(key, old_value, new_value):
            shown = "<removed>" if new_value is _REMOVED else new_value
            out.append(Loosening(key, old_value, shown, _reason(key, fresh)))
    return out


def budget_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten a contract mapping to ``{"op.matmul.float32.rtol": 1e-05, ...}`` for comparison."""
    keys: dict[str, Any] = {}
    if "schema_version" in data:
        keys["schema_version"] = data["schema_version"]
    for op_class, rows in _mapping(data.get("op")).items():
        for dtype, row in _mapping(rows).items():
            for name, value in _mapping(row).items():
                keys[f"op.{op_class}.{dtype}.{name}"] = value
    model = _mapping(data.get("model"))
    for name in ("factor", "floor", "tail_factor"):
        table = model.get(name)
        if isinstance(table, Mapping):
            for dtype, value in table.items():
                keys[f"model.{name}.{dtype}"] = value
        elif name in model:
            keys[f"model.{name}"] = table
    if "tail_factor" not in model and isinstance(model.get("factor"), Mapping):
        # NOTE: schema 1 judged the worst error by `factor`: that was its tail factor.
        for dtype, value in model["factor"].items():
            keys[f"model.tail_factor.{dtype}"] = value
    if "noise_bits" in model:
        keys["model.noise_bits"] = model["noise_bits"]
    # NOTE: absent means none: the baseline is eager in the case's own layout alone (schema 1).
    keys["model.baseline_layouts"] = tuple(model.get("baseline_layouts", ()))
    bitwise = _mapping(data.get("bitwise"))
    if "order_preserving" in bitwise:
        keys["bitwise.order_preserving"] = bitwise["order_preserving"]
    grad = _mapping(data.get("gradcheck"))
    for name in _NUMERIC:
        if name in grad:
            keys[f"gradcheck.{name}"] = grad[name]
    return keys


class _Removed:
    def __repr__(self) -> str:
        return "<removed>"


_REMOVED = _Removed()


def _looser(key: str, old: Any, new: Any) -> bool:
    leaf = key.rsplit(".", 1)[-1]
    if leaf == "accum":
        return bool(_ACCUM_WIDTH.get(str(new), 0) < _ACCUM_WIDTH.get(str(old), 0))
    if leaf == "nondeterministic":
        return bool(new) and not bool(old)
    if leaf == "order_preserving":
        return bool(old) and not bool(new)
    if leaf == "schema_version":
        return bool(new != old)  # NOTE: a new schema changes what keys mean: say why.
    if leaf == "baseline_layouts":
        # NOTE: each layout added lets eager's error in it raise the baseline the factor scales.
        return bool(set(new) - set(old))
    try:
        return float(new) > float(old)
    except (TypeError, ValueError):
        return True  # NOTE: a budget that is no longer a number is no budget at all.


def _data(contract: Contract | Mapping[str, Any]) -> Mapping[str, Any]:
    return contract.data if isinstance(contract, Contract) else contract


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entry_id(entry: Mapping[str, Any]) -> tuple[str, str]:
    return (str(entry.get("version")), str(entry.get("reason")))


def _entries(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = data.get("changelog")
    if not isinstance(raw, list | tuple):
        return []
    return [e for e in raw if isinstance(e, Mapping)]


def _new_entries(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    seen = {_entry_id(e) for e in _entries(old)}
    return [e for e in _entries(new) if _entry_id(e) not in seen]


def _reason(key: str, entries: list[Mapping[str, Any]]) -> str | None:
    for entry in entries:
        changes = entry.get("changes", ())
        if isinstance(changes, list | tuple) and any(
            isinstance(p, str) and fnmatch.fnmatchcase(key, p) for p in changes
        ):
            reason = entry.get("reason")
            if isinstance(reason, str) and reason.strip():
                return reason
    return None

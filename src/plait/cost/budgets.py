"""Compile budgets: per-stage time budgets and a memory budget, checked as a compile finishes.

``plait.compile(..., options={"budgets": {...}})`` sets them; every field is off (None) by
default, so a compile is never slowed or refused by a budget nobody declared:

- ``passes_s``: seconds for the pass pipeline;
- ``backend_s``: seconds for the backend (plan, codegen, C++ build, runner);
- ``compile_s``: seconds for both;
- ``memory_bytes``: the program's peak live bytes (the Stax memory plan's estimate: its arena
  plus what PyTorch and the caller own at the peak);
- ``on_miss``: ``"warn"`` (the default: a :class:`plait.errors.PerformanceWarning`) or
  ``"raise"`` (a :class:`plait.errors.PerformanceRegressionError`).

A miss is also recorded in the manifest's timings (``budget.<name>``: the budget that was
missed), beside the measured time: the timings section is where run-to-run facts live.

Example:
    >>> b = Budgets.of({"passes_s": 0.5, "on_miss": "raise"})
    >>> [str(m) for m in b.misses({"passes": 0.75})]
    ['passes_s: 0.75 s against a budget of 0.5 s']
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from plait.errors import InvalidOptionError, PerformanceRegressionError, PerformanceWarning

_TIMES = {"passes_s": ("passes",), "backend_s": ("backend",), "compile_s": ("passes", "backend")}


@dataclass(frozen=True)
class Miss:
    budget: str
    measured: float
    limit: float

    def __str__(self) -> str:
        if self.budget == "memory_bytes":
            return f"memory_bytes: {self.measured:.0f} bytes against a budget of {self.limit:.0f}"
        return f"{self.budget}: {self.measured:.3g} s against a budget of {self.limit:.3g} s"


@dataclass(frozen=True)
class Budgets:
    passes_s: float | None = None
    backend_s: float | None = None
    compile_s: float | None = None
    memory_bytes: int | None = None
    on_miss: str = "warn"

    @classmethod
    def of(cls, option: Mapping[str, Any] | None) -> Budgets | None:
        """The ``budgets`` option (None: no budgets); unknown keys and values are refused."""
        if option is None:
            return None
        if not isinstance(option, Mapping):
            raise InvalidOptionError(
                f"options['budgets'] must be a dict, got {type(option).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(option) - known)
        if unknown:
            raise InvalidOptionError(f"unknown budgets {unknown}; known: {sorted(known)}")
        if option.get("on_miss", "warn") not in ("warn", "raise"):
            raise InvalidOptionError(
                f"budgets on_miss must be 'warn' or 'raise', got {option['on_miss']!r}"
            )
        for k, v in option.items():
            if k != "on_miss" and v is not None and (not isinstance(v, (int, float)) or v < 0):
                raise InvalidOptionError(f"budget {k} must be a nonnegative number, got {v!r}")
        return cls(**option)

    def misses(self, timings: Mapping[str, float], peak_bytes: int | None = None) -> list[Miss]:
        out = []
        for name, parts in _TIMES.items():
            limit = getattr(self, name)
            if limit is None or not all(p in timings for p in parts):
                continue
            measured = sum(float(timings[p]) for p in parts)
            if measured > limit:
                out.append(Miss(name, measured, float(limit)))
        limit_bytes = self.memory_bytes
        if limit_bytes is not None and peak_bytes is not None and peak_bytes > limit_bytes:
            out.append(Miss("memory_bytes", float(peak_bytes), float(limit_bytes)))
        return out


def enforce(option: Mapping[str, Any] | None, manifest: Any, what: str) -> None:
    """Check a finished compile's manifest against the ``budgets`` option: record each miss in
    its timings, then warn or raise as ``on_miss`` says. ``what`` names the compiled callable."""
    budgets = Budgets.of(option)
    if budgets is None:
        return
    peak = manifest.executor.get("memory_plan", {}).get("peak_live_bytes")
    misses = budgets.misses(manifest.timings, peak if isinstance(peak, int) else None)
    if not misses:
        return
    for m in misses:
        manifest.timings[f"budget.{m.budget}"] = m.limit
    message = f"{what}: compile budget missed: " + "; ".join(str(m) for m in misses)
    if budgets.on_miss == "raise":
        raise PerformanceRegressionError(message)
    warnings.warn(message, PerformanceWarning, stacklevel=3)

"""The region engines of one compiled module (:class:`RegionTree`): made on a submodule's first
call, with what identical blocks share (:mod:`plait.regions.sharing`), the op counts
(:mod:`plait.regions.op_counts`), the report ``plait.explain`` shows and the manifests of the
specializations that run split.
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from plait.cache.lookup import warn_at_caller
from plait.errors import CaptureFallbackWarning
from plait.regions.op_counts import OpCounts
from plait.regions.sharing import BlockSharing


def _location(err: Exception | None) -> dict[str, Any]:
    if err is None:
        return {}
    return {
        "operation": getattr(err, "operation", None),
        "file": getattr(err, "filename", None),
        "line": getattr(err, "lineno", None),
    }


class RegionTree(BlockSharing, OpCounts):
    """The region engines of one compiled module, by submodule, with what identical blocks
    share (:class:`~plait.regions.sharing.BlockSharing`) and the op counts
    (:class:`~plait.regions.op_counts.OpCounts`). ``make_engine(module, path, share)`` makes a
    region engine (``share``: whether the module has identical blocks in the tree). ``counts``:
    ``captures`` and ``compiles`` the region engines ran, ``programs_shared`` and
    ``artifacts_shared`` (captures and compiles a block took from an identical one instead)."""

    def __init__(
        self,
        root: nn.Module,
        make_engine: Callable[[nn.Module, str, bool], Any],
        root_engine: Any,
    ) -> None:
        BlockSharing.__init__(self, root)
        OpCounts.__init__(self)
        self.make_engine = make_engine
        self.root_engine = root_engine
        self.version = 0  # NOTE: bumped by each new engine or specialization in the tree
        self._reported = -1
        # NOTE: one thread at a time runs the module's Python with regions dispatched: the
        # dispatch slots are module attributes, and a capture must never see another call's.
        self.lock = threading.RLock()
        self.engines: dict[int, Any] = {}
        self.order: list[Any] = []  # region engines in the order they were made

    def warn(self, message: str) -> None:
        """A region's warning, attributed where the compiled module's own warnings are: the
        frame that called it (two above its engine's call); the innermost frame outside plait
        and PyTorch when that call is not on the stack."""
        frame, level = sys._getframe(1), 1
        while frame is not None:
            if frame.f_code.co_name == "__call__" and frame.f_locals.get("self") is (
                self.root_engine
            ):
                warnings.warn(message, CaptureFallbackWarning, stacklevel=level + 3)
                return
            frame, level = frame.f_back, level + 1  # type: ignore[assignment]
        warn_at_caller(message, CaptureFallbackWarning)

    def path_of(self, module: nn.Module) -> str:
        return self.names.get(id(module), f"<{type(module).__name__} outside the module>")

    def engine_for(self, module: nn.Module) -> Any:
        engine = self.engines.get(id(module))
        if engine is None:
            if id(module) not in self.names:
                self._index()
            path = self.path_of(module)
            self.unshared.pop(path, None)  # NOTE: a replaced submodule's reason is not its
            engine = self.make_engine(module, path, self.shared(module))
            self.engines[id(module)] = engine
            self.order.append(engine)
            self.version += 1
        return engine

    def ran_otherwise(self) -> None:
        """A region's calls run another way than before (split for hooks, or as the region
        again): the manifests are refreshed, and the op counts measured again on the next call
        of the root's plan unless this call measures them."""
        self.version += 1
        if self.counter is None:
            self.measured = None

    # --- the report -------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Regions, boundaries, op shares and sharing counts, as JSON values."""
        root_engine = self.root_engine
        measured = self.measured or {"eager": {}, "compiled": {}, "opaque": {}}
        # NOTE: a submodule replaced since its region ran is no longer the module's: its
        # engine's regions and boundaries are not reported
        live = {id(m): name for name, m in self.root.named_modules()}
        engines = [e for e in self.order if live.get(id(e.fn)) == e.path]
        rank = {name: k for k, name in enumerate(live.values())}
        engines.sort(key=lambda e: rank[e.path])  # NOTE: in module order, as made or not
        artifact_users: dict[int, list[str]] = {}
        for e in engines:
            for s in e.specializations if e.hooked is None else ():  # NOTE: runs split now
                if s.executor is not None:
                    artifact_users.setdefault(id(s.compiled), []).append(e.path)
        regions: list[dict[str, Any]] = []
        boundaries: list[dict[str, Any]] = []
        # NOTE: a module whose call fell back and went on eagerly from the refusal: its regions
        # are captured and compiled from its next call (docs/capture.md)
        pending = [
            e.path for e in [root_engine, *engines] if e.regions is not None and not e.regions.runs
        ]
        for e in [root_engine, *engines]:
            for s in e.specializations:
                if s.executor is None and s.fallback_reason is not None:
                    boundary = {
                        "module": e.path,
                        "class": type(e.fn).__name__,
                        "reason": s.fallback_reason,
                        **_location(s.program.fallback_error),
                    }
                    if boundary not in boundaries:  # NOTE: once, for all its specializations
                        boundaries.append(boundary)
            for why in (e.refused, e.hooked, (e.limit_fallback or {}).get("reason")):
                if why is not None:
                    boundaries.append(
                        {"module": e.path, "class": type(e.fn).__name__, "reason": why}
                    )
            if e is root_engine:
                continue
            compiled = [s for s in e.specializations if s.executor is not None]
            split = e.regions is not None
            calls = {"compiled": sum(s.calls for s in compiled), "split": e.split_calls}
            if e.hooked is not None:  # NOTE: its latest calls ran split, whatever it compiled
                compiled = []
            status = "compiled" if compiled else "split" if split else "eager"
            others = sorted(
                {p for s in compiled for p in artifact_users.get(id(s.compiled), ())} - {e.path}
            )
            backends = sorted({s.manifest.executor.get("backend", "?") for s in compiled})
            regions.append(
                {
                    "module": e.path,
                    "class": type(e.fn).__name__,
                    "status": status,
                    "reason": e.hooked if e.hooked is not None else e.refused,
                    "calls": calls,
                    "backends": backends,
                    "specializations": len(e.specializations),
                    "shares_artifact_with": others,
                    "not_shared": self.unshared.get(e.path),
                    "compiled_ops": measured["compiled"].get(e.path, 0),
                    "opaque_ops": measured["opaque"].get(e.path, 0),
                    "eager_ops": measured["eager"].get(e.path, 0),
                }
            )
        total_c = sum(measured["compiled"].values())
        total_o = sum(measured["opaque"].values())
        total_e = sum(measured["eager"].values())
        total = total_c + total_o + total_e
        return {
            "regions": regions,
            "boundaries": boundaries,
            "pending": pending,
            "ops": {
                "measured": self.measured is not None,
                "compiled": total_c,
                "opaque": total_o,
                "eager": total_e,
                "eager_in_root": measured["eager"].get(root_engine.path, 0),
                "compiled_share": (total_c / total) if total else None,
            },
            "sharing": dict(self.counts),
        }

    def refresh_manifests(self) -> None:
        """The manifest of each specialization that runs split says so and lists its regions
        and boundaries (those under its module)."""
        if self._reported == self.version:
            return
        self._reported = self.version
        report = self.report()
        for e in [self.root_engine, *self.order]:
            if e.regions is None:
                continue
            prefix = f"{e.path}." if e.path else ""
            mine = [r for r in report["regions"] if r["module"].startswith(prefix)]
            section = {
                "backend": "regional",
                "regions": [
                    {k: r[k] for k in ("module", "class", "status", "backends")} for r in mine
                ],
                "boundaries": [
                    {k: b.get(k) for k in ("module", "class", "operation", "file", "line")}
                    | {"reason": str(b["reason"]).splitlines()[0]}
                    for b in report["boundaries"]
                    if b["module"] == e.path or b["module"].startswith(prefix)
                ],
            }
            for s in e.specializations:
                if s.executor is None:
                    s.manifest.executor = section

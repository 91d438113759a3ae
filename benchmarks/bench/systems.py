"""The systems the benchmark compares, and what plait's manifest says about each compile.

``eager`` is the model itself; ``plait`` is ``plait.compile(model, backend="stax",
dynamic=False)`` on the CPU (on CUDA, ``backend=None``: plait's default there, Stax with Triton
kernels where Triton is installed, the reference interpreter otherwise; the manifest says which);
``inductor`` is ``torch.compile(model, backend="inductor", dynamic=False)``. Both compile each
batch size as its own static program: with plait's default (automatic dynamic) the second batch
size would run a symbolic program, and the comparison would not be like for like.
An ablation is plait with one optimisation turned off (see :data:`config.ABLATIONS`).

Example:
    >>> from benchmarks.bench.config import ablation
    >>> plait_options(ablation("fold-bn"))[0]["passes"].count("fold-bn")
    0
    >>> plait_options(ablation("channels-last"))[0]["stax"]
    {'channels_last': False}
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks.bench.config import Ablation

Fn = Callable[[torch.Tensor], torch.Tensor]


def plait_options(ab: Ablation | None) -> tuple[dict[str, Any] | None, str | None]:
    """``plait.compile`` options for an ablation, or ``(None, why it is not available)``."""
    from plait.passes import INFERENCE_PIPELINE
    from plait.runtime import StaxOptions

    if ab is None:
        return {}, None
    options: dict[str, Any] = dict(ab.options)
    if ab.passes_drop:
        passes = INFERENCE_PIPELINE.split(",")
        missing = [p for p in ab.passes_drop if p not in passes]
        if missing:
            return None, f"not available: {missing} not in the inference pipeline"
        options["passes"] = ",".join(p for p in passes if p not in ab.passes_drop)
    if ab.stax:
        fields = {f.name for f in dataclasses.fields(StaxOptions)}
        missing = sorted(set(ab.stax) - fields)
        if missing:
            return None, f"not available: StaxOptions has no {missing} knob yet"
        options["stax"] = dict(ab.stax)
    return options, None


@dataclass
class System:
    """One compiled (or eager) callable under measurement."""

    name: str
    kind: str  # eager | plait | inductor
    device: str
    model: nn.Module
    fn: Fn
    options: dict[str, Any] = field(default_factory=dict)
    wrapper_s: float = 0.0
    first_call_s: dict[int, float] = field(default_factory=dict)  # batch size -> seconds
    warnings: list[str] = field(default_factory=list)
    compiled: Any = None
    ablation: str | None = None


def preimport(kinds: Iterable[str]) -> None:
    """Import each compiler's stack up front, so a wrapper call or a first call measures the
    compiler and not Python importing its modules (the import time is recorded apart)."""
    for kind in kinds:
        if kind == "plait":
            importlib.import_module("plait.api")
            importlib.import_module("plait.runtime")
        elif kind == "inductor":
            importlib.import_module("torch._dynamo")
            importlib.import_module("torch._inductor.compile_fx")


def build(
    kind: str,
    model: nn.Module,
    device: str,
    options: dict[str, Any] | None = None,
    name: str | None = None,
    perturb: float = 0.0,
) -> System:
    """Wrap ``model`` for ``kind``; time the wrapper call. ``perturb`` (tests only) scales the
    logits of a plait system by ``1 + perturb``."""
    options = dict(options or {})
    label = name or (kind if device == "cpu" else f"{kind}-{device}")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _wrap(kind, model, device, options)
    wrapper_s = time.perf_counter() - start
    fn: Fn = model if compiled is None else compiled
    if perturb and kind == "plait":
        inner = fn
        fn = lambda x: inner(x) * (1.0 + perturb)
    system = System(label, kind, device, model, fn, options, wrapper_s, compiled=compiled)
    system.warnings += [str(w.message) for w in caught]
    return system


def _wrap(kind: str, model: nn.Module, device: str, options: dict[str, Any]) -> Any:
    if kind == "eager":
        return None
    if kind == "plait":
        import plait

        backend = "stax" if device == "cpu" else None
        return plait.compile(model, backend=backend, dynamic=False, options=options or None)
    if kind == "inductor":
        return torch.compile(model, backend="inductor", dynamic=False)
    raise ValueError(f"unknown system kind {kind!r}")


@contextlib.contextmanager
def recording(system: System) -> Iterator[None]:
    """Collect the warnings emitted inside (plait announces each fallback once) into
    ``system.warnings`` instead of printing them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if str(w.message) not in system.warnings:
            system.warnings.append(str(w.message))


def first_call(system: System, x: torch.Tensor, sync: Callable[[], None]) -> torch.Tensor:
    """The first call at this input shape (capture + compile for compilers), timed."""
    with recording(system):
        sync()
        start = time.perf_counter()
        y = system.fn(x)
        sync()
        system.first_call_s[int(x.shape[0])] = time.perf_counter() - start
    return y


# --- what plait's manifest says -----------------------------------------------------------------
def _bytes_or_none(n: Any) -> int | None:
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def manifest_summary(compiled: Any) -> dict[str, Any] | None:
    """Codegen evidence and compile facts of a plait system's latest specialization."""
    specs = getattr(compiled, "specializations", None)
    if not specs:
        return None
    m = specs[-1].manifest
    counts = dict(m.executor.get("evidence", {}).get("counts", {}))
    plan = m.executor.get("memory_plan") or {}
    hits = [v for k, v in m.timings.items() if k.endswith(".cache_hit")]
    fired = [
        {"pass": p["name"], "rewrites": len(p.get("rewrites", []))}
        for p in m.passes
        if p.get("changed")
    ]
    return {
        "backend": m.executor.get("backend"),
        "requested_backend": m.executor.get("requested", m.options.get("backend")),
        "counts": {k: int(v) for k, v in counts.items()},
        "nodes_captured": m.graph.get("nodes_captured"),
        "nodes_optimized": m.graph.get("nodes_optimized"),
        "frozen": len(m.graph.get("frozen", [])),
        "passes_fired": fired,
        "fallbacks": [f"{f['what']}: {f['reason']}" for f in m.fallbacks],
        "kernels": len(m.kernels.get("kernels", [])),
        "kernels_cached": sum(bool(h) for h in hits),
        # NOTE: a symbolic program's plan is sized per call ("per call"): no one number
        "planned_peak_bytes": _bytes_or_none(plan.get("peak_live_bytes")),
        "arena_bytes": _bytes_or_none(plan.get("arena_bytes")),
        "timings_s": {
            k: round(float(v), 6)
            for k, v in m.timings.items()
            if k in ("passes", "backend") or (k.startswith("stax.") and k.count(".") == 1)
        },
        "specializations": len(specs),
    }

"""Ablations: plait with each optimisation turned off in turn, against plait with all of them.

Each ablation (see :data:`benchmarks.bench.config.ABLATIONS`) maps to one ``plait.compile``
option: a pass pipeline without the pass, ``freeze=False``, or a ``StaxOptions`` knob. A knob
that does not exist yet is reported "not available", never measured. For each available one, at
the largest batch size: the compile cost (cold, in a fresh process, when ablation workers are
on), steady-state latency (interleaved with full plait), planned and measured peak memory, the
codegen evidence, and parity (the gate's verdict, errors for display). ``effect`` holds the ratio
*without / with* the optimisation for each cost: above 1 means the optimisation lowered that cost
in this run; ``claims`` checks each cost the optimisation says it improves: ``held``, ``not
held``, ``within noise`` (3%) or ``unmeasured``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from benchmarks.bench import parity, systems, timing
from benchmarks.bench.config import BenchConfig, ablation
from benchmarks.bench.data import ImageSet
from benchmarks.bench.worker import run_worker
from plait.progress import Progress

NOISE = 0.03  # NOTE: ratios within 3% of 1 are called noise, not an effect.

if TYPE_CHECKING:
    from benchmarks.bench.run import Inference


def _ratio(without: Any, with_: Any) -> float | None:
    """``without / with_``; None where either is not a number (a symbolic program's memory
    plan is sized per call: ``"per call"``) or ``with_`` is not positive."""
    numbers = (int, float)
    if not isinstance(without, numbers) or not isinstance(with_, numbers) or with_ <= 0:
        return None
    return without / with_


def _cold(rec: dict[str, Any] | None, key: str) -> float | None:
    if not rec or "error" in rec:
        return None
    value = rec.get(key)
    return None if value is None else float(value)


def _entry(name: str) -> dict[str, Any]:
    ab = ablation(name)
    options, why = systems.plait_options(ab)
    return {
        "name": ab.name,
        "what": ab.what,
        "improves": list(ab.improves),
        "available": options is not None,
        "reason": why,
        "options": options,
        "error": None,
        "compile": None,
        "latency": None,
        "memory": None,
        "codegen": None,
        "parity": None,
        "effect": None,
        "claims": None,
    }


def run(
    cfg: BenchConfig,
    model: nn.Module,
    data: ImageSet,
    cpu: Inference | None,
    costs: dict[str, dict[str, Any]],
    root: Path,
    progress: Progress,
) -> dict[str, Any] | None:
    """The ablation study (see the module docstring); None when no ablation was asked for."""
    from benchmarks.bench.run import WORKER_TIMEOUT_S, cache_dirs, interleave, worker_spec

    if not cfg.ablations:
        return None
    entries = [_entry(n) for n in cfg.ablations]
    full = next((s for s in (cpu.live() if cpu else []) if s.kind == "plait"), None)
    if cpu is None or full is None:
        for e in entries:
            e["available"], e["reason"] = False, "plait did not run on the CPU in this run"
        return {"batch_size": None, "baseline": None, "variants": entries}
    bs = max(cfg.batch_sizes)
    batches = [data.batch(i, bs)[0] for i in range(cfg.warmup + cfg.repeats)]
    live: list[tuple[dict[str, Any], systems.System]] = []
    todo = [e for e in entries if e["available"]]
    with torch.no_grad(), progress.task("ablations: compile", total=len(todo)) as advance:
        for e in todo:
            s = systems.build(
                "plait", model, "cpu", e["options"], f"plait-no-{e['name']}", cfg.perturb_plait
            )
            try:
                systems.first_call(s, batches[0], lambda: None)
            except Exception as exc:  # NOTE: recorded; a plait configuration that fails is fatal.
                e["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                advance(note=f"{e['name']}: error")
                continue
            cold = None
            if cfg.ablation_workers:
                spec = worker_spec(cfg, "plait", "cpu", e["options"])
                cold = run_worker(spec, cache_dirs(root, f"ablation-{e['name']}"), WORKER_TIMEOUT_S)
            e["compile"] = {"in_process_first_call_s": s.first_call_s[bs], "cold": cold}
            e["codegen"] = systems.manifest_summary(s.compiled)
            live.append((e, s))
            advance(note=e["name"])
    group = [full, *(s for _, s in live)]
    samples = interleave(group, batches, cfg.warmup, "cpu", progress, "ablations: repetitions")
    pbatches = [data.batch(i, bs)[0] for i in range(-(-cfg.parity_images // bs))]
    eager_out = parity.outputs(model, pbatches)[: cfg.parity_images]
    base_row = next(r for r in cpu.rows if r["system"] == full.name and r["batch_size"] == bs)
    base_cold = (costs.get(full.name) or {}).get("cold")
    base: dict[str, Any] = {
        "system": full.name,
        "latency": timing.summarize(samples[full.name]),
        "compile_cold_first_call_s": _cold(base_cold, "first_call_s"),
        "planned_peak_bytes": (base_row["codegen"] or {}).get("planned_peak_bytes"),
        "steady_peak_rss_growth_bytes": _cold(base_cold, "steady_peak_rss_growth_bytes"),
    }
    with progress.task("ablations: conformance gate", total=len(live)) as advance:
        for e, s in live:
            e["latency"] = timing.summarize(samples[s.name])
            cold = e["compile"]["cold"]
            e["memory"] = {
                "planned_peak_bytes": (e["codegen"] or {}).get("planned_peak_bytes"),
                "steady_peak_rss_growth_bytes": _cold(cold, "steady_peak_rss_growth_bytes"),
            }
            with systems.recording(s):
                gate = parity.gate(
                    model, s.fn, batches[0], module=s.model, draws=cfg.gate_draws,
                    layouts=("contiguous",),
                    seed=cfg.seed,
                )  # fmt: skip
            out = parity.outputs(s.fn, pbatches)[: cfg.parity_images]
            shown = parity.display(out, eager_out, cpu.ref64, cfg.parity_images)
            e["parity"] = {"display": shown, "gate": gate}
            e["effect"] = {
                "compile": _ratio(_cold(cold, "first_call_s"), base["compile_cold_first_call_s"]),
                "latency": _ratio(e["latency"]["p50_ms"], base["latency"]["p50_ms"]),
                "memory_planned": _ratio(
                    e["memory"]["planned_peak_bytes"], base["planned_peak_bytes"]
                ),
                "memory_rss": _ratio(
                    e["memory"]["steady_peak_rss_growth_bytes"],
                    base["steady_peak_rss_growth_bytes"],
                ),
            }
            e["claims"] = {cost: _holds(e["effect"], cost) for cost in e["improves"]}
            advance(note=f"{e['name']}: {'ok' if gate['ok'] else 'FAILED'}")
    return {"batch_size": bs, "baseline": base, "variants": entries}


def _holds(effect: dict[str, float | None], cost: str) -> str:
    """Did turning the optimisation off make ``cost`` worse in this run? ``held`` (ratio above
    1 + NOISE), ``not held`` (below 1 - NOISE: the optimisation made it worse), ``within noise``,
    or ``unmeasured``. Memory is judged on the plan, else on the measured RSS."""
    key = {"compile": "compile", "latency": "latency", "memory": "memory_planned"}[cost]
    value = effect.get(key)
    if cost == "memory" and effect.get("memory_rss") is not None and value in (None, 1.0):
        value = effect["memory_rss"]
    if value is None:
        return "unmeasured"
    if value > 1 + NOISE:
        return "held"
    return "not held" if value < 1 - NOISE else "within noise"

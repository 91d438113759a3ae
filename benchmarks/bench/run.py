"""One benchmark run: compile cost in fresh processes, then steady state, parity and evidence
for every system and batch size, then the ablations and the training phase.

The result is a JSON-ready dict (schema: ``benchmarks/schema/resnet_classification.schema.json``)
whose ``verdict`` says whether every plait configuration passed the conformance gate.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.bench import ablate, parity, systems, timing, training
from benchmarks.bench.config import SCHEMA_VERSION, BenchConfig
from benchmarks.bench.data import ImageSet, build_model, load_images, weights_record
from benchmarks.bench.worker import run_worker
from plait.progress import Progress

WORKER_TIMEOUT_S = 1800.0
CACHE_ENV = ("PLAIT_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def devices_for(device: str) -> list[str]:
    cuda = torch.cuda.is_available()
    if device == "auto":
        return ["cpu", "cuda"] if cuda else ["cpu"]
    if device == "cuda" and not cuda:
        raise RuntimeError("--device cuda: CUDA is not available on this machine")
    return [device]


@contextlib.contextmanager
def cache_env(values: dict[str, str]) -> Iterator[None]:
    """Point plait's and inductor's caches (and any other variable of ``values``) at ``values``
    inside; restore the environment after."""
    saved = {k: os.environ.get(k) for k in {*CACHE_ENV, *values}}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cache_dirs(root: Path, name: str) -> dict[str, str]:
    return {
        "PLAIT_CACHE_DIR": str(root / name / "plait"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / name / "inductor"),
    }


def worker_spec(
    cfg: BenchConfig, kind: str, device: str, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "kind": kind,
        "device": device,
        "options": options or {},
        "model": cfg.model,
        "seed": cfg.seed,
        "data": cfg.data,
        "image_size": cfg.image_size,
        "batch_size": max(cfg.batch_sizes),
        "threads": cfg.threads,
    }


def compile_costs(
    cfg: BenchConfig, devices: list[str], root: Path, progress: Progress
) -> dict[str, dict[str, Any]]:
    """Cold (empty caches) then warm (same caches) first-call measurements, each in a new
    process, per system and device, at the largest batch size."""
    out: dict[str, dict[str, Any]] = {}
    if not cfg.compile_workers:
        return out
    jobs = [(kind, device) for device in devices for kind in cfg.systems]
    with progress.task("compile cost (fresh processes)", total=2 * len(jobs)) as advance:
        for kind, device in jobs:
            name = kind if device == "cpu" else f"{kind}-{device}"
            env = cache_dirs(root, name)
            rec: dict[str, Any] = {"batch_size": max(cfg.batch_sizes)}
            for state in ("cold", "warm"):
                rec[state] = run_worker(worker_spec(cfg, kind, device), env, WORKER_TIMEOUT_S)
                advance(note=f"{name} {state}: {_first(rec[state])}")
            out[name] = rec
    return out


def _first(rec: dict[str, Any]) -> str:
    if "error" in rec:
        return f"error ({rec['error'][:120]})"
    return f"wrapper {rec['wrapper_s']:.2f} s, first call {rec['first_call_s']:.2f} s"


def interleave(
    group: list[systems.System],
    batches: list[torch.Tensor],
    warmup: int,
    device: str,
    progress: Progress,
    label: str,
    block: int = 1,
    lead: int = 0,
) -> dict[str, list[float]]:
    """Warm-up calls, then timed calls in turns: each system makes ``block`` consecutive timed
    calls per turn, and the order of the systems rotates every turn so that no system always
    runs first (or right after a given other one).

    ``lead``: untimed calls opening each turn. Systems with thread pools of their own spin-wait
    after a call (ONNX Runtime's intra-op threads, OpenMP's): on a machine with as many cores as
    threads, the first calls after another system share their cores with its spinning threads
    (measured on 2 cores, MobileNetV2 at 2 threads: ONNX Runtime's first call after plait's
    8.3 ms, its next ones 3.6-4.1 ms). A pause instead of calls does not help on every machine:
    after 0.1 s idle, both systems' calls took 3x longer on a 2-core VM.
    """
    samples: dict[str, list[float]] = {s.name: [] for s in group}
    timed = batches[warmup:]
    turns = [timed[i : i + block] for i in range(0, len(timed), block)]
    with torch.no_grad(), progress.task(label, total=len(batches)) as advance:
        for i, x in enumerate(batches[:warmup]):
            k = i % len(group)
            for s in group[k:] + group[:k]:
                timing.timed(functools.partial(s.fn, x), device)
            advance()
        for t, turn in enumerate(turns):
            k = (warmup + t) % len(group)
            for s in group[k:] + group[:k]:
                for _ in range(lead):
                    timing.timed(functools.partial(s.fn, turn[0]), device)
                for x in turn:
                    seconds, _ = timing.timed(functools.partial(s.fn, x), device)
                    samples[s.name].append(seconds)
            advance(len(turn))
    return samples


def _throughput(batch: int, seconds: list[float]) -> float:
    return batch * len(seconds) / sum(seconds)


def _parity_batches(data: ImageSet, images: int, batch: int, device: str) -> list[torch.Tensor]:
    return [data.batch(i, batch)[0].to(device) for i in range(math.ceil(images / batch))]


class Inference:
    """The inference measurements of one device."""

    def __init__(
        self, cfg: BenchConfig, device: str, model: nn.Module, data: ImageSet, progress: Progress
    ) -> None:
        self.cfg, self.device, self.data, self.progress = cfg, device, data, progress
        self.model = model if device == "cpu" else copy.deepcopy(model).to(device)
        self.ref64 = parity.outputs(
            parity.float64_model(model),
            [x.double() for x in _parity_batches(data, cfg.parity_images, 16, "cpu")],
        )[: cfg.parity_images]
        self.systems: list[systems.System] = []
        self.errors: dict[str, str] = {}
        for kind in cfg.systems:
            s = systems.build(kind, self.model, device, perturb=cfg.perturb_plait)
            self.systems.append(s)
        self.rows: list[dict[str, Any]] = []

    def sync(self) -> None:
        timing.sync(self.device)

    def live(self) -> list[systems.System]:
        return [s for s in self.systems if s.name not in self.errors]

    def batch(self, bs: int) -> None:
        cfg, progress = self.cfg, self.progress
        batches = [
            self.data.batch(i, bs)[0].to(self.device) for i in range(cfg.warmup + cfg.repeats)
        ]
        evidence: dict[str, Any] = {}
        with torch.no_grad(), progress.task(f"batch {bs}: first calls", len(self.systems)) as adv:
            for s in self.live():
                try:
                    systems.first_call(s, batches[0], self.sync)
                except Exception as exc:  # NOTE: recorded, and fatal for plait (see verdict).
                    self.errors[s.name] = f"{type(exc).__name__}: {exc}"[:2000]
                evidence[s.name] = systems.manifest_summary(s.compiled)
                adv(note=f"{s.name} {s.first_call_s.get(bs, float('nan')):.2f} s")
        group = self.live()
        samples = interleave(
            group, batches, cfg.warmup, self.device, progress, f"batch {bs}: repetitions"
        )
        pbatches = _parity_batches(self.data, cfg.parity_images, bs, self.device)
        outs = {s.name: parity.outputs(s.fn, pbatches)[: cfg.parity_images] for s in group}
        eager_name = group[0].name
        eager_p50 = timing.summarize(samples[eager_name])["p50_ms"]
        with progress.task(f"batch {bs}: conformance gate", total=len(group) - 1) as adv:
            for s in group:
                lat = timing.summarize(samples[s.name])
                gate = None
                if s.kind != "eager":
                    layouts = cfg.gate_layouts if s.kind == "plait" else ("contiguous",)
                    with systems.recording(s):
                        gate = parity.gate(
                            self.model, s.fn, batches[0], module=s.model, draws=cfg.gate_draws,
                            layouts=layouts, seed=cfg.seed,
                        )  # fmt: skip
                    adv(note=f"{s.name}: {'ok' if gate['ok'] else 'FAILED'}")
                self.rows.append(
                    {
                        "system": s.name,
                        "kind": s.kind,
                        "device": self.device,
                        "batch_size": bs,
                        "first_call_s": s.first_call_s[bs],
                        "latency": lat,
                        "throughput_images_per_s": _throughput(bs, samples[s.name]),
                        "speedup_vs_eager_p50": eager_p50 / lat["p50_ms"],
                        "codegen": evidence.get(s.name),
                        "parity": {
                            "display": parity.display(
                                outs[s.name], outs[eager_name], self.ref64, cfg.parity_images
                            ),
                            "gate": gate,
                        },
                    }
                )

    def system_records(self, costs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "name": s.name,
                "kind": s.kind,
                "device": s.device,
                "available": s.name not in self.errors,
                "error": self.errors.get(s.name),
                "wrapper_s": s.wrapper_s,
                "options": s.options,
                "compile": costs.get(s.name),
                "warnings": s.warnings,
            }
            for s in self.systems
        ]


def run(cfg: BenchConfig, progress: Progress) -> dict[str, Any]:
    """The whole benchmark (see the module docstring)."""
    torch.set_num_threads(cfg.threads)
    systems.preimport(cfg.systems)
    env = timing.environment(cfg.threads)
    devices = devices_for(cfg.device)
    data = load_images(cfg.image_size, cfg.data)
    model = build_model(cfg.model, cfg.seed, data)
    progress.log(
        f"{cfg.model}, {cfg.image_size}x{cfg.image_size}, batches {list(cfg.batch_sizes)}, "
        f"systems {list(cfg.systems)}, devices {devices}, {cfg.threads} thread(s)"
    )
    with tempfile.TemporaryDirectory(prefix="plait-bench-") as tmp:
        root = Path(tmp)
        costs = compile_costs(cfg, devices, root, progress)
        warm = {
            "PLAIT_CACHE_DIR": cache_dirs(root, "plait")["PLAIT_CACHE_DIR"],
            "TORCHINDUCTOR_CACHE_DIR": cache_dirs(root, "inductor")["TORCHINDUCTOR_CACHE_DIR"],
        }
        with cache_env(warm):
            per_device = []
            for device in devices:
                inf = Inference(cfg, device, model, data, progress)
                for bs in cfg.batch_sizes:
                    inf.batch(bs)
                per_device.append(inf)
            cpu = per_device[0] if devices[0] == "cpu" else None
            ablations = ablate.run(cfg, model, data, cpu, costs, root, progress)
            train = training.run(cfg, model, data, progress) if cfg.train_steps else None
    env["load_average_end"] = list(os.getloadavg())
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "resnet_classification",
        "config": cfg.record(),
        "environment": env,
        "dataset": data.record(),
        "weights": weights_record(cfg.model, cfg.seed),
        "systems": [r for inf in per_device for r in inf.system_records(costs)],
        "results": [row for inf in per_device for row in inf.rows],
        "ablations": ablations,
        "training": train,
    }
    result["verdict"] = verdict(result)
    return result


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Every plait configuration must pass the gate; a plait system that failed to run fails."""
    failures: list[str] = []
    errors: list[str] = []
    for s in result["systems"]:
        if s["kind"] == "plait" and not s["available"]:
            errors.append(f"{s['name']}: {s['error']}")
    for row in result["results"]:
        gate = row["parity"]["gate"]
        if row["kind"] == "plait" and gate is not None and not gate["ok"]:
            failures.append(f"{row['system']} batch {row['batch_size']}: {_worst(gate)}")
    for a in (result["ablations"] or {}).get("variants", []):
        gate = (a.get("parity") or {}).get("gate")
        if gate is not None and not gate["ok"]:
            failures.append(f"ablation {a['name']}: {_worst(gate)}")
        if a.get("error"):
            errors.append(f"ablation {a['name']}: {a['error']}")
    for t in (result["training"] or {}).get("systems", []):
        if t["kind"] == "plait" and t["gate"] is not None and not t["gate"]["ok"]:
            failures.append(f"training {t['system']}: {_worst(t['gate'])}")
        state = t.get("state_after_steps") or {}
        if t["kind"] == "plait" and state and not state["within_contract"]:
            failures.append(
                f"training {t['system']}: state after the steps beyond the contract's model rule "
                f"(RMS error {state['rms_error_vs_float64']:.3g} against eager's "
                f"{state['eager_rms_error_vs_float64']:.3g})"
            )
    others = [
        f"{row['system']} batch {row['batch_size']}"
        for row in result["results"]
        if row["kind"] != "plait" and row["parity"]["gate"] and not row["parity"]["gate"]["ok"]
    ]
    code = 1 if failures else (3 if errors else 0)
    return {
        "parity_ok": not failures,
        "plait_failures": failures,
        "plait_errors": errors,
        "other_gate_failures": others,
        "exit_code": code,
    }


def _worst(gate: dict[str, Any]) -> str:
    first = next((f for f in gate["failures"] if f["severity"] == "error"), None)
    if first is None:
        return "gate failed"
    return f"{first['check']} {first['where']} @ {first['case']}: {first['message']}"[:300]

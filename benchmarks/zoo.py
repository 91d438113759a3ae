"""The model-zoo benchmark: models nobody on the project wrote, CPU inference in float32; also
``plait bench zoo``.

    python -m benchmarks.zoo                      # every model that builds here (tens of minutes)
    python -m benchmarks.zoo --quick --json out.json   # tiny configs, for CI smoke tests
    python -m benchmarks.zoo --models hf-bert-base,hf-gpt2 --threads 1

Per model (see ``benchmarks/zoo_models.py``; built from configs, random weights, nothing
downloaded) and per system (eager, plait, inductor, ONNX Runtime, OpenVINO; see
``benchmarks/zoo_systems.py``): whether plait compiled it whole, partly or fell back (from
``plait.explain``), parity judged by the conformance gate, the cold compile (first call, caches
empty: plait with ``options={"cache": False}`` and a fresh ``PLAIT_CACHE_DIR``, inductor with a
fresh ``TORCHINDUCTOR_CACHE_DIR``; in this process), and steady-state latency as medians of
interleaved repetitions, at one thread and at all threads. A failure in one cell is recorded
there and the run goes on. Outputs: JSON and Markdown. Exit status 1 when plait failed the gate
on a model (a wrong answer), else 0; errors are listed, not fatal. See docs/benchmark.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import torch

from benchmarks import zoo_models, zoo_report, zoo_systems
from benchmarks.bench import parity, systems, timing
from benchmarks.bench.run import cache_env, interleave
from plait.progress import Progress

SCHEMA_VERSION = "1.0"
# NOTE: at more than one thread each system makes TURN timed calls in a row, opened by LEAD
# untimed ones: ONNX Runtime's intra-op threads and OpenMP's spin-wait after a call, and the
# next system's first calls share the cores with them (on 2 cores: ONNX Runtime's first call
# after plait's 8.3 ms, its next ones 3.6-4.1 ms). An idle pause instead made every system's
# calls 3x slower on a 2-core VM.
TURN, LEAD = 8, 2
STEM = "zoo"
OUT_DEFAULT = Path("benchmarks/out")
MAX_WARNINGS = 20


@dataclass(frozen=True)
class ZooConfig:
    quick: bool
    models: tuple[str, ...]
    systems: tuple[str, ...]
    threads: tuple[int, ...]
    repeats: int
    warmup: int
    gate_draws: int
    seed: int
    perturb_plait: float = 0.0

    @classmethod
    def preset(cls, quick: bool, **kw: Any) -> ZooConfig:
        default_models = zoo_models.QUICK_DEFAULT if quick else tuple(
            m.name for m in zoo_models.MODELS
        )  # fmt: skip
        default_systems = zoo_systems.KINDS if not quick else tuple(
            k for k in zoo_systems.KINDS if k != "inductor"
        )  # fmt: skip
        cfg = cls(
            quick=quick,
            models=kw.get("models") or default_models,
            systems=kw.get("systems") or default_systems,
            threads=kw.get("threads") or all_threads(),
            repeats=kw.get("repeats") or (3 if quick else 10),
            warmup=kw.get("warmup") if kw.get("warmup") is not None else (1 if quick else 2),
            gate_draws=kw.get("gate_draws") or (1 if quick else 2),
            seed=kw.get("seed") or 0,
            perturb_plait=kw.get("perturb_plait") or 0.0,
        )
        cfg.check()
        return cfg

    def check(self) -> None:
        for name in self.models:
            zoo_models.entry(name)  # NOTE: raises ValueError naming the known models.
        unknown = [s for s in self.systems if s not in zoo_systems.KINDS]
        if unknown:
            raise ValueError(f"unknown systems {unknown}; known: {list(zoo_systems.KINDS)}")
        if "eager" not in self.systems:
            raise ValueError("--systems must include eager: it is the reference")
        if min(self.threads) < 1 or self.repeats < 1 or self.warmup < 0 or self.gate_draws < 1:
            raise ValueError("threads, repeats and gate draws must be >= 1, warmup >= 0")


def all_threads() -> tuple[int, ...]:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return tuple(dict.fromkeys((1, n)))


@contextlib.contextmanager
def fresh_caches(root: Path) -> Iterator[None]:
    """plait's and inductor's caches pointed at empty directories inside; restored after."""
    values = {
        "PLAIT_CACHE_DIR": str(root / "plait"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
    }
    with cache_env(values):
        yield


# --- one model -----------------------------------------------------------------------------------
class ModelRun:
    def __init__(self, cfg: ZooConfig, model: zoo_models.ZooModel, workdir: Path) -> None:
        self.cfg, self.model, self.workdir = cfg, model, workdir
        self.record: dict[str, Any] = {
            "name": model.name,
            "family": model.family,
            "source": model.source,
            "what": model.what,
            "input": model.input_desc(cfg.quick),
            "status": "ran",
            "reason": None,
            "parameters": None,
            "plait": None,
            "systems": {},
            "warnings": [],
        }

    def run(self, progress: Progress) -> dict[str, Any]:
        """Build, export, compile, judge and time the model; every failure becomes a record.
        Warnings (plait announces each fallback) are collected into the record, not printed."""
        threads = torch.get_num_threads()  # NOTE: the caller's, given back (a test after it runs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                self._run(progress)
            finally:
                torch.set_num_threads(threads)
        seen = dict.fromkeys(str(w.message)[: zoo_systems.MAX_ERROR] for w in caught)
        self.record["warnings"] = list(seen)[:MAX_WARNINGS]
        return self.record

    def _run(self, progress: Progress) -> dict[str, Any]:
        cfg, rec = self.cfg, self.record
        problem = zoo_models.source_problem(self.model.source)
        if problem:
            rec.update(status="skipped", reason=problem)
            return rec
        torch.set_num_threads(cfg.threads[0])
        try:
            built = zoo_models.build(self.model, quick=cfg.quick, seed=cfg.seed)
            with torch.no_grad():
                reference = built.module(built.example).detach().clone()
        except Exception as exc:  # NOTE: a model that does not build here is a skip, with why.
            rec.update(status="skipped", reason=f"does not build: {zoo_systems.short(exc)}")
            return rec
        rec["parameters"] = built.parameters
        onnx = None
        if {"onnxruntime", "openvino"} & set(cfg.systems):
            with progress.task(f"{self.model.name}: ONNX export", total=1) as adv:
                onnx = zoo_systems.OnnxFile.export(
                    built.module, built.example, self.workdir / "model.onnx"
                )
                adv(note=onnx.exporter or "failed")
        runners = [zoo_systems.Runner(k, built.module, built.example, onnx) for k in cfg.systems]
        with (
            fresh_caches(self.workdir),
            progress.task(f"{self.model.name}: cold compiles", total=len(runners)) as adv,
        ):
            for r in runners:
                r.error = zoo_systems.unavailable(r.kind)
                if r.error is None:
                    r.prepare(cfg.threads[0])
                adv(note=f"{r.kind}: {_cold(r)}")
            live = [r for r in runners if r.error is None]
            self._parity(built, reference, live, progress)
            self._latency(built, live, progress)
        if any(r.kind == "plait" and r.compiled is not None for r in runners):
            plait_runner = next(r for r in runners if r.kind == "plait")
            rec["plait"] = zoo_systems.plait_coverage(plait_runner.compiled)
        for r in runners:
            rec["systems"][r.kind] = self._system_record(r)
        return rec

    def _candidate(self, r: zoo_systems.Runner) -> zoo_systems.Fn:
        fn = r.fn(self.cfg.threads[0])
        if r.kind == "plait" and self.cfg.perturb_plait:
            inner, scale = fn, 1.0 + self.cfg.perturb_plait
            return lambda x: inner(x) * scale
        return fn

    def _parity(
        self,
        built: zoo_models.Built,
        reference: torch.Tensor,
        live: list[zoo_systems.Runner],
        progress: Progress,
    ) -> None:
        judged = [r for r in live if r.kind != "eager"]
        with progress.task(f"{self.model.name}: conformance gate", total=len(judged)) as adv:
            for r in judged:
                fn = self._candidate(r)
                try:
                    with torch.no_grad():
                        y = fn(built.example)
                    r.compile["display"] = parity.errors(y, reference)
                except Exception as exc:  # NOTE: a system that cannot run its example fails.
                    r.error = zoo_systems.short(exc)
                    adv(note=f"{r.kind}: error")
                    continue
                r.compile["gate"] = parity.gate(
                    built.module, fn, built.example, module=built.module,
                    draws=self.cfg.gate_draws, layouts=("contiguous",), seed=self.cfg.seed,
                )  # fmt: skip
                adv(note=f"{r.kind}: {'ok' if r.compile['gate']['ok'] else 'FAILED'}")

    def _latency(
        self, built: zoo_models.Built, live: list[zoo_systems.Runner], progress: Progress
    ) -> None:
        cfg = self.cfg
        for threads in cfg.threads:
            torch.set_num_threads(threads)
            group = []
            for r in live:
                if r.error is not None:
                    continue
                try:
                    fn = self._candidate(r) if threads == cfg.threads[0] else r.fn(threads)
                except Exception as exc:  # NOTE: e.g. a session that cannot be made: its cell.
                    r.compile.setdefault("latency_errors", {})[str(threads)] = zoo_systems.short(
                        exc
                    )
                    continue
                group.append(systems.System(r.kind, r.kind, "cpu", built.module, fn))
            batches = [built.example] * (cfg.warmup + cfg.repeats)
            label = f"{self.model.name}: {threads} thread(s)"
            try:
                samples = interleave(
                    group, batches, cfg.warmup, "cpu", progress, label,
                    **({"block": TURN, "lead": LEAD} if threads > 1 else {}),
                )  # fmt: skip
            except Exception as exc:  # NOTE: a steady-state call that raises: every cell says so.
                for r in live:
                    r.compile.setdefault("latency_errors", {})[str(threads)] = (
                        f"a timed call raised: {zoo_systems.short(exc)}"
                    )
                continue
            stats = {name: timing.summarize(s) for name, s in samples.items()}
            eager = stats.get("eager", {}).get("p50_ms")
            inductor = stats.get("inductor", {}).get("p50_ms")
            for r in live:
                if r.kind not in stats:
                    continue
                st = dict(stats[r.kind])
                st["speedup_vs_eager_p50"] = eager / st["p50_ms"] if eager else None
                st["speedup_vs_inductor_p50"] = inductor / st["p50_ms"] if inductor else None
                r.compile.setdefault("latency", {})[str(threads)] = st
        torch.set_num_threads(cfg.threads[0])

    @staticmethod
    def _system_record(r: zoo_systems.Runner) -> dict[str, Any]:
        c = dict(r.compile)
        return {
            "available": r.error is None,
            "error": r.error,
            "compile": {k: v for k, v in c.items()
                        if k not in ("gate", "display", "latency", "latency_errors")},
            "gate": c.get("gate"),
            "vs_eager": c.get("display"),
            "latency": c.get("latency", {}),
            "latency_errors": c.get("latency_errors", {}),
            "warnings": r.warnings[:10],
        }  # fmt: skip


def _cold(r: zoo_systems.Runner) -> str:
    if r.error:
        return f"error ({r.error[:80]})"
    cold = r.compile.get("cold_s")
    return "–" if cold is None else f"{cold:.2f} s"


# --- the run -------------------------------------------------------------------------------------
def run(cfg: ZooConfig, progress: Progress) -> dict[str, Any]:
    systems.preimport([k for k in cfg.systems if k in ("plait", "inductor")])
    env = timing.environment(cfg.threads[0])
    env["threads"] = list(cfg.threads)
    progress.log(
        f"zoo: {len(cfg.models)} model(s), systems {list(cfg.systems)}, threads "
        f"{list(cfg.threads)}, {'quick (tiny configs)' if cfg.quick else 'full sizes'}"
    )
    records = []
    with tempfile.TemporaryDirectory(prefix="plait-zoo-") as tmp:
        for name in cfg.models:
            workdir = Path(tmp) / name
            workdir.mkdir()
            records.append(ModelRun(cfg, zoo_models.entry(name), workdir).run(progress))
    env["load_average_end"] = list(os.getloadavg())
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "benchmark": "zoo",
        "config": asdict(cfg),
        "environment": env,
        "models": records,
    }
    result["verdict"] = verdict(records)
    return result


def verdict(records: list[dict[str, Any]]) -> dict[str, Any]:
    """plait failing the gate on a model is the one fatal outcome (exit 1); plait errors and
    other systems' failures are listed."""
    failures, errors, others = [], [], []
    for m in records:
        for kind, s in m["systems"].items():
            gate = s.get("gate")
            if kind == "plait" and gate is not None and not gate["ok"]:
                failures.append(f"{m['name']}: {zoo_report.worst(gate)}")
            elif kind == "plait" and s["error"]:
                errors.append(f"{m['name']}: {s['error'][:300]}")
            elif gate is not None and not gate["ok"]:
                others.append(f"{m['name']} {kind}: {zoo_report.worst(gate)}")
    return {
        "parity_ok": not failures,
        "plait_failures": failures,
        "plait_errors": errors,
        "other_gate_failures": others,
        "exit_code": 1 if failures else 0,
    }


# --- the command ---------------------------------------------------------------------------------
def _names(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    if text.strip() == "all":
        return tuple(m.name for m in zoo_models.MODELS)
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _systems(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    if text.strip() == "all":
        return zoo_systems.KINDS
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _threads(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    n = all_threads()[-1]
    return tuple(dict.fromkeys(n if t.strip() == "all" else int(t) for t in text.split(",")))


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--quick", is_flag=True, help="Tiny configs of 4 models, no inductor: for CI.")
@click.option("--models", help="Comma-separated zoo models, or all (default: all; quick: 4).")
@click.option("--systems", help="Comma-separated: eager,plait,inductor,onnxruntime,openvino.")
@click.option("--threads", help="Comma-separated thread counts; 'all' = the CPUs (default 1,all).")
@click.option("--repeats", type=int, help="Timed interleaved repetitions (default 10; quick 3).")
@click.option("--warmup", type=int, help="Untimed calls per system first (default 2; quick 1).")
@click.option("--gate-draws", type=int, help="Fresh draws the gate judges (default 2; quick 1).")
@click.option("--seed", type=int, help="Seed of weights, inputs and the gate's draws (default 0).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help=f"Directory for {STEM}.json and {STEM}.md (default {OUT_DEFAULT}).")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON here.")  # fmt: skip
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the Markdown report here.")  # fmt: skip
@click.option("--progress", "progress_mode", default="auto",
              type=click.Choice(["auto", "rich", "plain", "quiet"]),
              help="Progress display on stderr (default: bars on a terminal).")  # fmt: skip
@click.option("--list", "list_models", is_flag=True, help="List the zoo's models and exit.")
@click.option("--perturb-plait", type=float, hidden=True,
              help="Test only: scale plait's outputs by 1+x (the gate must fail).")  # fmt: skip
@click.pass_context
def main(ctx: click.Context, **kw: Any) -> None:
    """Model zoo, CPU inference: eager vs plait vs inductor vs ONNX Runtime vs OpenVINO.

    Exit status: 0, or 1 when plait failed the conformance gate on a model.
    """
    if kw.pop("list_models"):
        for m in zoo_models.MODELS:
            problem = zoo_models.source_problem(m.source)
            click.echo(
                f"{m.name:24} {m.family:6} {m.what}" + (f"  [skip: {problem}]" * bool(problem))
            )
        return
    out, json_path, md = kw.pop("out"), kw.pop("json_path"), kw.pop("markdown")
    if out is None and json_path is None and md is None:
        out = OUT_DEFAULT
    if out is not None:
        json_path, md = json_path or out / f"{STEM}.json", md or out / f"{STEM}.md"
    progress = Progress(kw.pop("progress_mode"))
    try:
        cfg = ZooConfig.preset(
            kw.pop("quick"),
            models=_names(kw.pop("models")),
            systems=_systems(kw.pop("systems")),
            threads=_threads(kw.pop("threads")),
            **kw,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        result = run(cfg, progress)
    finally:
        progress.close()
    text = zoo_report.markdown(result)
    if json_path is not None:
        zoo_report.write_json(result, json_path)
    if md is not None:
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text(text)
    click.echo(text)
    for label, path in (("json", json_path), ("markdown", md)):
        if path is not None:
            click.echo(f"{label}: {path}", err=True)
    for line in result["verdict"]["plait_failures"]:
        click.echo(f"FAILED: {line}", err=True)
    ctx.exit(int(result["verdict"]["exit_code"]))


if __name__ == "__main__":
    sys.exit(main())

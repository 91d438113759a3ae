"""The Stax CPU benchmark: eager PyTorch, ``torch.compile`` (default inductor) and plait's Stax
backend, side by side in one run.

Workloads: ResNet-18 inference at batch 1 and 8 (224x224); a 2-layer GPT-2 style block
(d=768, 12 heads, 128 tokens, batch 1); an MLP (512 -> 2048 -> GELU -> 512 -> LayerNorm, batch
64); a chain of 10 pointwise ops on 1M elements. Plus: cold first-compile times (each in a fresh
process with empty caches, for both compilers) and the per-call overhead of a 10-op graph on
tiny tensors.

Method: each system is warmed up, then timed in interleaved rounds (eager, inductor, stax, eager,
...), each sample the mean of a few calls; the reported number is the median over rounds. All
inference runs under ``torch.no_grad()``. Where Stax misses a target, the per-step profile of
its schedule shows what dominates.

Where Apache TVM is installed, two more columns: ``tvm`` (``backend="tvm"``: Stax with its
kernels printed and built by TVM, default schedule) and ``tvm tuned`` (``tvm_tune`` trials of
MetaSchedule per kernel, ``--tvm-trials``). ``--tvm-ablation`` writes a section of its own
(:mod:`benchmarks.tvm_kernels`): each workload's kernels timed one by one, C++ printer against
TVM, and pointwise and reduction micro-benchmarks, with the tuning time.

Usage::

    python -m benchmarks.stax_cpu                 # everything, updates its section of RESULTS.md
    python -m benchmarks.stax_cpu --only mlp --rounds 5 --no-cold --output /tmp/r.md
    python -m benchmarks.stax_cpu --tvm-ablation --rounds 5   # the TVM kernels' own section
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.models.gpt2 import Block, GPT2Config
from benchmarks.models.resnet import resnet18

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"vs_eager": 1.2, "vs_inductor": 1.1, "compile_fraction": 0.25, "overhead_us": 20.0}


class MLP(nn.Module):
    """512 -> 2048 -> GELU -> 512 -> LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(512, 2048), nn.Linear(2048, 512)
        self.norm = nn.LayerNorm(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc2(F.gelu(self.fc1(x))))


class Pointwise10(nn.Module):
    """Ten pointwise ops in a chain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * 1.5 + 0.25)
        y = torch.sigmoid(y) * x
        y = torch.tanh(y - 0.5)
        return torch.exp(-y) + x


def _gpt2_blocks() -> nn.Module:
    cfg = GPT2Config(block_size=128, n_head=12, d_model=768)
    return nn.Sequential(Block(cfg), Block(cfg))


WORKLOADS: dict[
    str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]], int]
] = {
    # name: (model, inputs, calls per timed sample)
    "resnet18_b1": (resnet18, lambda: (torch.randn(1, 3, 224, 224),), 2),
    "resnet18_b8": (resnet18, lambda: (torch.randn(8, 3, 224, 224),), 1),
    "gpt2_block2": (_gpt2_blocks, lambda: (torch.randn(1, 128, 768),), 3),
    "mlp": (MLP, lambda: (torch.randn(64, 512),), 10),
    "pointwise10_1M": (Pointwise10, lambda: (torch.randn(1 << 20),), 10),
}


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


# NOTE: MetaSchedule trials per kernel of the tuned TVM column (main() sets it from --tvm-trials)
TVM_TRIALS = [8]


def tvm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("tvm") is not None


def systems() -> tuple[str, ...]:
    """The compared systems: eager, inductor, stax, and where TVM is installed its columns."""
    base = ("eager", "inductor", "stax")
    return (*base, "tvm", "tvm_tuned") if tvm_installed() else base


def _build(name: str, system: str) -> Callable[..., Any]:
    import plait

    make_model, _, _ = WORKLOADS[name]
    torch.manual_seed(0)
    model = make_model().eval()
    if system == "eager":
        return model
    if system == "inductor":
        return torch.compile(model)
    if system == "tvm":
        return plait.compile(model, backend="tvm")
    if system == "tvm_tuned":
        return plait.compile(model, backend="tvm", options={"tvm_tune": TVM_TRIALS[0]})
    return plait.compile(model, backend="stax")


def _time(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls


def run_workload(
    name: str, rounds: int, compared: tuple[str, ...] | None = None, profile: bool = True
) -> dict[str, Any]:
    """``compared``: the systems (default :func:`systems`; eager always, the reference)."""
    _, make_inputs, calls = WORKLOADS[name]
    torch.manual_seed(1)
    args = make_inputs()
    chosen = compared or systems()
    built = {s: _build(name, s) for s in ("eager", *[s for s in chosen if s != "eager"])}
    samples: dict[str, list[float]] = {s: [] for s in built}
    with torch.no_grad():
        reference = built["eager"](*args)
        for s, fn in built.items():
            for _ in range(3):
                out = fn(*args)
            err = float((out.double() - reference.double()).abs().max())
            samples.setdefault(f"{s}_maxdiff", []).append(err)
        order = list(built)
        for r in range(rounds):
            # NOTE: rotate who goes first each round, so no system always runs after another.
            k = r % len(order)
            for s in order[k:] + order[:k]:
                samples[s].append(_time(built[s], args, calls))
    med = {s: statistics.median(samples[s]) for s in built}
    spread = {s: _iqr(samples[s]) / med[s] for s in built}
    return {
        "name": name,
        "ms": {s: med[s] * 1e3 for s in built},
        "vs_eager": med["eager"] / med["stax"] if "stax" in med else None,
        "vs_inductor": med["inductor"] / med["stax"] if "inductor" in med else None,
        "inductor_vs_eager": med["eager"] / med["inductor"] if "inductor" in med else None,
        "maxdiff": {s: samples[f"{s}_maxdiff"][0] for s in built},
        "relative_iqr": spread,
        "profile": profile_stax(name, args) if profile else None,
    }


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[2] - q[0]


def stax_program(name: str, args: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """The StaxProgram ``plait.compile`` builds for the workload, and its bound inputs."""
    import plait
    from plait.runtime import compile_graph

    make_model, _, _ = WORKLOADS[name]
    torch.manual_seed(0)
    model = make_model().eval()
    compiled = plait.compile(model, backend="stax")
    with torch.no_grad():
        compiled(*args)
    spec = compiled.specializations[0].compiled
    graph = spec.graph
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    users = iter(args)
    inputs = []
    for v in graph.inputs:
        if v.name in graph.constants:
            inputs.append(graph.constants[v.name])
        elif v.kind == "user":
            inputs.append(next(users))
        else:
            inputs.append(state[v.name])
    program = getattr(spec, "program", None)
    return (program if program is not None else compile_graph(graph)), inputs


def profile_stax(name: str, args: tuple[Any, ...]) -> dict[str, Any]:
    program, inputs = stax_program(name, args)
    with torch.no_grad():
        steps = program.profile(*inputs, repeat=5)
    total = sum(s["seconds"] for s in steps)
    by_kind: dict[str, float] = {}
    for s in steps:
        key = s["op"] if s["kind"] != "kernel" else "native kernels"
        by_kind[key] = by_kind.get(key, 0.0) + s["seconds"]
    return {
        "total_ms": total * 1e3,
        "share": {k: v / total for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "evidence": program.evidence.counts,
        "kernels": len(program.kernels),
        "arena_bytes": program.memory_plan.arena_bytes,
        "peak_live_bytes": program.memory_plan.peak_live_bytes,
    }


# --- cold compile, in a fresh process per (workload, system) ----------------------------------
def cold_compile_child(name: str, system: str) -> None:
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    _, make_inputs, _ = WORKLOADS[name]
    args = make_inputs()
    fn = _build(name, system)
    with torch.no_grad():
        start = time.perf_counter()
        fn(*args)
        first = time.perf_counter() - start
        start = time.perf_counter()
        fn(*args)
        second = time.perf_counter() - start
    print(json.dumps({"seconds": first - second}))


def cold_compile(name: str, system: str) -> float:
    with tempfile.TemporaryDirectory(prefix="stax-bench-") as tmp:
        env = {**os.environ, "PLAIT_CACHE_DIR": f"{tmp}/plait",
               "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "PYTHONPATH": str(ROOT)}  # fmt: skip
        cmd = [sys.executable, "-m", "benchmarks.stax_cpu", "--cold-child", name, system]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"cold compile of {name} with {system} failed:\n{proc.stderr[-3000:]}"
            )
        return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


# --- per-call overhead ------------------------------------------------------------------------
def overhead(rounds: int) -> dict[str, float]:
    """Median wall time of one call of a 10-op graph on 8-element tensors (all of it overhead)."""
    import plait
    from plait.ir import GraphBuilder, TensorType
    from plait.runtime import compile_graph

    gb = GraphBuilder()
    x = gb.input("x", TensorType((8,), torch.float32))
    y = gb.call("relu", gb.call("add", gb.call("mul", x, 1.5), 0.25))
    y = gb.call("mul", gb.call("sigmoid", y), x)
    y = gb.call("tanh", gb.call("sub", y, 0.5))
    gb.output(gb.call("add", gb.call("exp", gb.call("neg", y)), x))
    program = compile_graph(gb.build())
    model = Pointwise10()
    compiled = plait.compile(model, backend="stax")
    inductor = torch.compile(model)
    t = torch.randn(8)
    calls = 2000
    out: dict[str, list[float]] = {
        "stax_program": [],
        "plait_compile": [],
        "eager": [],
        "inductor": [],
    }
    fns = {"stax_program": program, "plait_compile": compiled, "eager": model, "inductor": inductor}
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(50):
                fn(t)
        for _ in range(rounds):
            for k, fn in fns.items():
                out[k].append(_time(fn, (t,), calls))
    return {k: statistics.median(v) * 1e6 for k, v in out.items()}


# --- report -----------------------------------------------------------------------------------
def machine() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        text = ""
    keep = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
            "L1d cache", "L2 cache", "L3 cache")  # fmt: skip
    lines = [ln.strip() for ln in text.splitlines() if ln.split(":")[0].strip() in keep]
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "fma") if f in text]
    lines.append(f"SIMD flags: {', '.join(flags)}")
    lines.append(f"Python {platform.python_version()}, torch {torch.__version__}, "
                 f"torch threads {torch.get_num_threads()}")  # fmt: skip
    return "\n".join(lines)


def ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


def report(results: list[dict], cold: dict[str, dict[str, float]], over: dict[str, float] | None,
           loads: tuple[str, str], rounds: int) -> str:  # fmt: skip
    today = datetime.date.today().isoformat()
    out = [
        "# Stax CPU benchmark: eager vs torch.compile vs stax",
        "",
        f"Date: {today}. Produced by `python -m benchmarks.stax_cpu` ({rounds} interleaved rounds, "
        "medians; inference under `torch.no_grad()`).",
        f"Load average at start / end: {loads[0]} / {loads[1]} (the machine is shared; numbers "
        "taken under load are noisy, see the notes).",
        "",
        "## Machine",
        "",
        "```",
        machine(),
        "```",
        "",
        "## Steady-state time per call (ms, median)",
        "",
    ]
    tvm = bool(results) and "tvm" in results[0]["ms"]
    tvm_head = f" tvm | tvm tuned ({TVM_TRIALS[0]} trials/kernel) |" if tvm else ""
    out += [
        f"| workload | eager | torch.compile | stax |{tvm_head} stax/eager >=1.2 | "
        "stax/inductor >=1.1 |",
        "|---|---:|---:|---:|" + ("---:|---:|" if tvm else "") + "---:|---:|",
    ]
    for r in results:
        ms = r["ms"]
        tvm_cells = f" {ms['tvm']:.3f} | {ms['tvm_tuned']:.3f} |" if tvm else ""
        out.append(
            f"| {r['name']} | {ms['eager']:.3f} | {ms['inductor']:.3f} | {ms['stax']:.3f} |"
            f"{tvm_cells} {r['vs_eager']:.2f}x {ok(r['vs_eager'] >= TARGETS['vs_eager'])} | "
            f"{r['vs_inductor']:.2f}x {ok(r['vs_inductor'] >= TARGETS['vs_inductor'])} |"
        )
    shown = list(results[0]["ms"]) if results else []
    out += ["", f"Spread (interquartile range / median, {' / '.join(shown)}): " + ", ".join(
        f"{r['name']} " + "/".join(f"{r['relative_iqr'][s]:.0%}" for s in shown)
        for r in results)]  # fmt: skip
    out += ["", "Max abs difference to eager (float32): " + ", ".join(
        f"{r['name']} " + " ".join(f"{s} {r['maxdiff'][s]:.1e}" for s in shown if s != "eager")
        for r in results)]  # fmt: skip
    if cold:
        out += ["", "## Cold first compile (s; fresh process, empty caches)", "",
                "| workload | torch.compile | stax | stax / inductor <=0.25 |",
                "|---|---:|---:|---:|"]  # fmt: skip
        for name, c in cold.items():
            frac = c["stax"] / c["inductor"]
            cells = f"{c['inductor']:.2f} | {c['stax']:.2f} | {frac:.3f} {ok(frac <= 0.25)}"
            out.append(f"| {name} | {cells} |")
    if over:
        out += ["", "## Per-call overhead: 10-op graph, 8-element tensors (us/call, median)", "",
                "| StaxProgram (raw) | plait.compile (guards + stax) | eager | torch.compile |",
                "|---:|---:|---:|---:|",
                f"| {over['stax_program']:.1f} {ok(over['stax_program'] <= 20)} | "
                f"{over['plait_compile']:.1f} {ok(over['plait_compile'] <= 20)} | "
                f"{over['eager']:.1f} | {over['inductor']:.1f} |"]  # fmt: skip
    out += ["", "## Stax profile (share of a call per step kind)", ""]
    for r in results:
        p = r["profile"]
        share = ", ".join(f"{k} {v:.0%}" for k, v in list(p["share"].items())[:5])
        out.append(f"- **{r['name']}** ({p['total_ms']:.2f} ms profiled; {p['kernels']} kernels; "
                   f"evidence {p['evidence']}; arena {p['arena_bytes']} B, peak live "
                   f"{p['peak_live_bytes']} B): {share}")  # fmt: skip
    return "\n".join(out) + "\n"


BEGIN, END = "<!-- stax_cpu: begin -->", "<!-- stax_cpu: end -->"


def write_section(path: Path, text: str) -> None:
    """Write this benchmark's section of ``path`` (between its markers), leaving the rest of the
    file (other benchmarks' results) as it is."""
    section = f"{BEGIN}\n{text}{END}\n"
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        new = head + section + (("\n" + tail) if tail else "")
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + section
    path.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-cold", action="store_true")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "RESULTS.md"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--cold-child", nargs=2, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tvm-trials", type=int, default=TVM_TRIALS[0])
    parser.add_argument("--tvm-ablation", action="store_true")
    args = parser.parse_args()
    TVM_TRIALS[0] = args.tvm_trials
    if args.cold_child:
        cold_compile_child(*args.cold_child)
        return
    if args.tvm_ablation:
        from benchmarks.tvm_kernels import run_ablation

        run_ablation(args.only, args.rounds, args.tvm_trials, Path(args.output))
        return
    names = args.only or list(WORKLOADS)
    start_load = _load()
    results = []
    for name in names:
        print(f"[stax_cpu] {name} ...", file=sys.stderr, flush=True)
        results.append(run_workload(name, args.rounds))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "profile"}), file=sys.stderr)
    over = overhead(max(5, args.rounds // 2))
    print(f"[stax_cpu] overhead {over}", file=sys.stderr)
    cold: dict[str, dict[str, float]] = {}
    if not args.no_cold:
        for name in names:
            cold[name] = {s: cold_compile(name, s) for s in ("inductor", "stax")}
            print(f"[stax_cpu] cold {name} {cold[name]}", file=sys.stderr, flush=True)
    text = report(results, cold, over, (start_load, _load()), args.rounds)
    write_section(Path(args.output), text)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "cold": cold, "overhead": over}, indent=1)
        )
    print(text)


if __name__ == "__main__":
    main()

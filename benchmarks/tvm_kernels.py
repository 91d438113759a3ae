"""TVM kernels against the C++ printer's: which kernels of the Stax CPU benchmark's workloads TVM
makes faster or slower (the ablation), and pointwise and reduction micro-benchmarks, untuned and
tuned, with the tuning time. Run through ``python -m benchmarks.stax_cpu --tvm-ablation``; writes
its own section of ``benchmarks/RESULTS.md``. ``python -m benchmarks.tvm_kernels --micro NAME ...``
runs micro-benchmarks alone and prints their rows (writes nothing).

Method. Ablation: each workload is compiled once by ``plait.compile`` (``backend="stax"``); the
same optimized graph is rebuilt with TVM kernels (``kernels="tvm"``), untuned and tuned (same
plan: the kernels correspond one to one); each program's instrumented runner
(:meth:`~plait.runtime.program.StaxProgram.profile`) times every step, in interleaved rounds;
the number per kernel is the median over rounds. Micro-benchmarks: one-kernel graphs, each
compiled three ways, timed call by call in interleaved rounds (the call's overhead, about a
microsecond, is in all three).
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
F32 = torch.float32


# --- micro-benchmarks -------------------------------------------------------------------------
def _graph(shapes: list[tuple[int, ...]], body: Callable[..., Any]) -> Any:
    from plait.ir import GraphBuilder, TensorType

    gb = GraphBuilder()
    xs = [gb.input(f"x{k}", TensorType(s, F32)) for k, s in enumerate(shapes)]
    gb.output(body(gb, *xs))
    return gb.build()


def _pointwise10(gb: Any, x: Any) -> Any:
    y = gb.call("relu", gb.call("add", gb.call("mul", x, 1.5), 0.25))
    y = gb.call("mul", gb.call("sigmoid", y), x)
    y = gb.call("tanh", gb.call("sub", y, 0.5))
    return gb.call("add", gb.call("exp", gb.call("neg", y)), x)


# name -> (kind, input shapes, graph body)
MICRO: dict[str, tuple[str, list[tuple[int, ...]], Callable[..., Any]]] = {
    "relu(x*1.5+y) 1M": ("pointwise", [(1 << 20,), (1 << 20,)],
                         lambda gb, x, y: gb.call(
                             "relu", gb.call("add", gb.call("mul", x, 1.5), y))),
    "x*y+z 8x128x1024": ("pointwise", [(8, 128, 1024)] * 3,
                         lambda gb, x, y, z: gb.call("add", gb.call("mul", x, y), z)),
    "transpose+add 1024x1024": ("pointwise", [(1024, 1024)] * 2,
                                lambda gb, x, y: gb.call(
                                    "add", gb.call("transpose", x, dim0=0, dim1=1), y)),
    "10-op chain (exp, tanh, sigmoid) 1M": ("pointwise", [(1 << 20,)], _pointwise10),
    "row sum 1024x1024": ("reduction", [(1024, 1024)],
                          lambda gb, x: gb.call("sum", x, dims=(1,))),
    "sum of squares 256x4096": ("reduction", [(256, 4096)],
                                lambda gb, x: gb.call("sum", gb.call("mul", x, x), dims=(1,))),
    "row max 4096x256": ("reduction", [(4096, 256)],
                         lambda gb, x: gb.call("amax", x, dims=(1,))),
    "layer_norm 512x768": ("reduction", [(512, 768), (768,), (768,)],
                           lambda gb, x, w, b: gb.call("layer_norm", x, w, b,
                                                       normalized_shape=(768,))),
    "softmax 512x1024": ("reduction", [(512, 1024)],
                         lambda gb, x: gb.call("softmax", x, dim=1)),
}  # fmt: skip


# NOTE: why a micro-benchmark's C++ kernel can stay faster (said where it does; softmax's scalar
# expf and the max's second pass for its NaN flag are gone: plait.codegen.tvm_lanes)
WHY_CPP_FASTER: dict[str, str] = {}


# NOTE: what micro-benchmarks are timed by: wall time; the process's CPU time with --cpu-time
# (one thread: on a loaded machine, time spent descheduled is not the kernel's)
CLOCK: list[Callable[[], float]] = [time.perf_counter]


def _time_calls(fn: Callable[[], object], calls: int) -> float:
    clock = CLOCK[0]
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls


def _call(program: Any, inputs: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: program(*inputs)


def micro(rounds: int, trials: int, names: list[str] | None = None) -> list[dict[str, Any]]:
    """The micro-benchmarks (``names``: those only), each compiled three ways and timed."""
    from plait.codegen.options import StaxOptions
    from plait.runtime import compile_graph

    out = []
    for name, (kind, shapes, body) in MICRO.items():
        if names is not None and name not in names:
            continue
        print(f"[tvm_kernels] micro {name}", file=sys.stderr, flush=True)
        graph = _graph(shapes, body)
        gen = torch.Generator().manual_seed(0)
        inputs = [torch.randn(s, generator=gen) for s in shapes]
        programs = {
            "cpp": compile_graph(graph),
            "tvm": compile_graph(graph, options=StaxOptions(kernels="tvm")),
            "tvm_tuned": compile_graph(graph, options=StaxOptions(kernels="tvm", tvm_tune=trials)),
        }
        want = programs["cpp"](*inputs)[0]
        for p in programs.values():
            got = p(*inputs)[0]
            # NOTE: a sanity check (the conformance gate judges TVM kernels in tests/tvm): sums
            # in another order differ by their rounding
            scale = max(1.0, float(want.abs().max()))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale, msg=name)
        calls = max(3, int(2e-3 / max(_time_calls(_call(programs["cpp"], inputs), 3), 1e-6)))
        samples: dict[str, list[float]] = {k: [] for k in programs}
        order = list(programs)
        for r in range(rounds):
            k = r % len(order)
            for s in order[k:] + order[:k]:
                samples[s].append(_time_calls(_call(programs[s], inputs), calls))
        us = {s: statistics.median(v) * 1e6 for s, v in samples.items()}
        tuned = programs["tvm_tuned"].kernels[0]
        out.append({
            "name": name, "kind": kind, "us": us, "kernels": len(programs["cpp"].kernels),
            "printers": [k.printer for k in programs["tvm"].kernels],
            "tuning": tuned.tuning or {}, "tuned_build_s": tuned.build_seconds,
        })  # fmt: skip
    return out


# --- the ablation: each workload's kernels ------------------------------------------------------
def _kernel_seconds(program: Any, inputs: list[Any], repeat: int) -> list[float]:
    with torch.no_grad():
        steps = program.profile(*inputs, repeat=repeat)
    return [s["seconds"] for s in steps if s["kind"] == "kernel"]


def ablation(name: str, rounds: int, trials: int) -> dict[str, Any]:
    from benchmarks.stax_cpu import WORKLOADS, stax_program
    from plait.runtime import compile_graph

    print(f"[tvm_kernels] ablation {name}", file=sys.stderr, flush=True)
    _, make_inputs, _ = WORKLOADS[name]
    torch.manual_seed(1)
    cpp, inputs = stax_program(name, make_inputs())
    base = dataclasses.replace(cpp.options, kernels="tvm")
    programs = {
        "cpp": cpp,
        "tvm": compile_graph(cpp.graph, options=base),
        "tvm_tuned": compile_graph(cpp.graph, options=dataclasses.replace(base, tvm_tune=trials)),
    }
    samples: dict[str, list[list[float]]] = {k: [] for k in programs}
    for r in range(rounds):
        order = list(programs)
        k = r % len(order)
        for s in order[k:] + order[:k]:
            samples[s].append(_kernel_seconds(programs[s], inputs, 3))
    per = {s: [statistics.median(col) * 1e6 for col in zip(*v)] for s, v in samples.items()}
    rows = []
    for j, info in enumerate(cpp.kernels):
        tuned = programs["tvm_tuned"].kernels[j]
        ops = sorted({n.op for n in cpp.graph.nodes if n.id in info.nodes})
        rows.append({
            "kernel": info.name, "template": info.template, "ops": ops,
            "cpp_us": per["cpp"][j], "tvm_us": per["tvm"][j], "tuned_us": per["tvm_tuned"][j],
            "printer": programs["tvm"].kernels[j].printer, "tuning": tuned.tuning or {},
        })  # fmt: skip
    return {"name": name, "kernels": rows}


# --- report -----------------------------------------------------------------------------------
def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=ROOT, check=False)  # fmt: skip
    return out.stdout.strip() or "unknown"


def _verdict(ratio: float) -> str:
    """``ratio``: C++ time over TVM time (above 1: TVM faster)."""
    if ratio >= 1.05:
        return "TVM faster"
    if ratio <= 0.95:
        return "**C++ faster**"
    return "same (within 5%)"


def report(micros: list[dict[str, Any]], abl: list[dict[str, Any]], rounds: int, trials: int,
           tuning_s: float, workloads: list[dict[str, Any]],
           loads: tuple[str, str]) -> str:  # fmt: skip
    from benchmarks.stax_cpu import machine
    from plait.codegen.tvm_build import toolchain_record

    tc = toolchain_record()
    out = [
        "# TVM kernels against the C++ printer: per-kernel ablation and micro-benchmarks",
        "",
        f"Date: {datetime.date.today().isoformat()}, commit {_commit()}. Produced by "
        f"`python -m benchmarks.stax_cpu --tvm-ablation --rounds {rounds} --tvm-trials {trials}` "
        f"({rounds} interleaved rounds, medians). Apache TVM {tc['tvm']}, target "
        f"`{tc['target']}`; tuned = {trials} MetaSchedule trials per kernel (the faster of the "
        "best trial and the default schedule). Total tuning (search) time: "
        f"{tuning_s:.1f} s. Load average at start / end: {loads[0]} / {loads[1]} (a shared "
        "machine: kernels of tens of microseconds vary by 10-20% between runs).",
        "",
        "```",
        machine(),
        "```",
        "",
        "## Workloads: whole calls (ms, median; `benchmarks.stax_cpu`'s workloads and method)",
        "",
        "| workload | eager | stax (C++ kernels) | tvm | tvm tuned | stax/tvm tuned |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {w['name']} | {w['ms']['eager']:.3f} | {w['ms']['stax']:.3f} | "
            f"{w['ms']['tvm']:.3f} | {w['ms']['tvm_tuned']:.3f} | "
            f"{w['ms']['stax'] / w['ms']['tvm_tuned']:.2f}x |"
            for w in workloads
        ),
        "",
        "## Micro-benchmarks (us per call, median)",
        "",
        "| kernel | kind | C++ | TVM | TVM tuned | C++/TVM tuned | tuning (s) | tuned schedule |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for m in micros:
        us, t = m["us"], m["tuning"]
        ratio = us["cpp"] / us["tvm_tuned"]
        out.append(
            f"| {m['name']} | {m['kind']} | {us['cpp']:.1f} | {us['tvm']:.1f} | "
            f"{us['tvm_tuned']:.1f} | {ratio:.2f}x {_verdict(ratio)} | "
            f"{t.get('seconds', 0.0):.1f} | {t.get('chosen', '-')} |"
        )
    out += ["", *_targets(micros, abl), ""]
    out += ["", "## Ablation: each kernel of the benchmark workloads (us per call, median)", ""]
    for a in abl:
        faster = sum(1 for k in a["kernels"] if k["cpp_us"] / k["tuned_us"] >= 1.05)
        slower = sum(1 for k in a["kernels"] if k["cpp_us"] / k["tuned_us"] <= 0.95)
        total = {s: sum(k[s] for k in a["kernels"]) for s in ("cpp_us", "tvm_us", "tuned_us")}
        out += [
            f"### {a['name']}: {len(a['kernels'])} kernels; tuned TVM faster on {faster}, "
            f"slower on {slower}; all kernels C++ {total['cpp_us']:.0f} us, TVM "
            f"{total['tvm_us']:.0f} us, TVM tuned {total['tuned_us']:.0f} us",
            "",
            "| kernel | ops | C++ | TVM | TVM tuned | C++/TVM tuned |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for k in a["kernels"]:
            ratio = k["cpp_us"] / k["tuned_us"]
            ops = ", ".join(k["ops"][:6]) + (" ..." if len(k["ops"]) > 6 else "")
            out.append(
                f"| {k['kernel']} ({k['template']}) | {ops} | {k['cpp_us']:.1f} | "
                f"{k['tvm_us']:.1f} | {k['tuned_us']:.1f} | {ratio:.2f}x {_verdict(ratio)} |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def _targets(micros: list[dict[str, Any]], abl: list[dict[str, Any]]) -> list[str]:
    kernels = [k for a in abl for k in a["kernels"]]
    by_tvm = sum(1 for k in kernels if k["printer"] == "tvm")
    out = [
        "## Targets",
        "",
        f"- Kernels of these workloads printed and built by TVM: {by_tvm} of {len(kernels)} (the "
        'conformance gate judges `backend="tvm"` on the benchmark models and the transformer '
        "block in `tests/tvm/test_tvm_models.py`; every kernel there is TVM's).",
    ]
    for kind in ("pointwise", "reduction"):
        rows = [m for m in micros if m["kind"] == kind]
        ok = [m for m in rows if m["us"]["cpp"] / m["us"]["tvm_tuned"] > 0.95]
        out.append(
            f"- Tuned TVM at least as fast as the C++ kernels (within 5%, this machine's noise "
            f"between runs) on {kind} micro-benchmarks: {len(ok)} of {len(rows)}."
        )
        for m in rows:
            if m not in ok:
                slower = m["us"]["tvm_tuned"] / m["us"]["cpp"]
                why = WHY_CPP_FASTER.get(m["name"], "no cause identified (run-to-run noise?)")
                out.append(f"  - {m['name']}: C++ {slower:.2f}x faster: {why}.")
    return out


BEGIN, END = "<!-- tvm_kernels: begin -->", "<!-- tvm_kernels: end -->"


def run_ablation(only: list[str] | None, rounds: int, trials: int, output: Path) -> None:
    import os
    import tempfile

    from benchmarks.stax_cpu import WORKLOADS

    # NOTE: a fresh kernel cache: every kernel is built, every tuned one searched (timed)
    os.environ["PLAIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="plait-tvm-bench-")
    start = time.perf_counter()
    from benchmarks.stax_cpu import _load, run_workload

    start_load = _load()
    micros = micro(rounds, trials)
    names = only or [n for n in WORKLOADS if n != "resnet18_b8"]
    abl = [ablation(n, max(3, rounds // 2), trials) for n in names]
    compared = ("eager", "stax", "tvm", "tvm_tuned")
    workloads = [run_workload(n, rounds, compared, profile=False) for n in names]
    tuning_s = sum(m["tuning"].get("seconds", 0.0) for m in micros)
    tuning_s += sum(k["tuning"].get("seconds", 0.0) for a in abl for k in a["kernels"])
    text = report(micros, abl, rounds, trials, tuning_s, workloads, (start_load, _load()))
    section = f"{BEGIN}\n{text}{END}\n"
    old = output.read_text() if output.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + section + rest.split(END, 1)[1].lstrip("\n")
    else:
        new = old + ("\n" if old and not old.endswith("\n\n") else "") + section
    output.write_text(new)
    print(text)
    print(f"[tvm_kernels] {time.perf_counter() - start:.0f} s", file=sys.stderr)


def main() -> None:
    """Micro-benchmarks alone (``--micro``: by name), their table rows printed."""
    import argparse
    import os
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--micro", nargs="*", default=None, help="micro-benchmark names")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tvm-trials", type=int, default=16)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by the process's CPU time (needs one thread)")  # fmt: skip
    args = parser.parse_args()
    if args.cpu_time:
        if torch.get_num_threads() != 1:
            parser.error("--cpu-time needs one thread (OMP_NUM_THREADS=1)")
        CLOCK[0] = time.process_time
    unknown = set(args.micro or ()) - set(MICRO)
    if unknown:
        parser.error(f"unknown micro-benchmarks {sorted(unknown)}; known: {list(MICRO)}")
    # NOTE: a fresh kernel cache: every kernel is built, every tuned one searched (timed)
    os.environ["PLAIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="plait-tvm-bench-")
    from benchmarks.stax_cpu import _load

    loads = _load()
    micros = micro(args.rounds, args.tvm_trials, args.micro)
    clock = "CPU time" if args.cpu_time else "wall time"
    print(f"commit {_commit()}, torch threads {torch.get_num_threads()}, {clock}, "
          f"{args.rounds} rounds, load {loads} / {_load()}")  # fmt: skip
    for m in micros:
        us, t = m["us"], m["tuning"]
        ratio = us["cpp"] / us["tvm_tuned"]
        print(
            f"| {m['name']} | {m['kind']} | {us['cpp']:.1f} | {us['tvm']:.1f} | "
            f"{us['tvm_tuned']:.1f} | {ratio:.2f}x {_verdict(ratio)} | "
            f"{t.get('seconds', 0.0):.1f} | {t.get('chosen', '-')} |"
        )


if __name__ == "__main__":
    main()

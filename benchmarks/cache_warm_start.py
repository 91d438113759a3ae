"""ResNet-18: cold vs warm first call through the artifact cache, and the guard cost per call.

Each measurement runs in a fresh process. *Cold*: an empty cache directory (no artifact, no
kernel): capture, passes, planning, C++ compiler, save. *Warm*: a new process on the cache the
cold one filled: capture (``--warm-start capture``, the default) or, with ``--warm-start
fingerprint``, the front key and the captured program from its snapshot (no capture); key, load,
rebuild from the saved plan (no pass, no dry run, no compiler, no weight reordered: the entry
carries oneDNN's prepacked weights; ``PLAIT_STAX_NO_COMPILE=1`` makes any compiler call an
error). With ``--speculative on`` (the default) the warm call's program, named by the hint the
cold process left, runs on another core while capture runs (:mod:`plait.speculative_run`);
``off`` runs it after capture. *Eager*: the model's own first call in a fresh process. First-call
times start at ``plait.compile`` and end with the first output (module imports, torch's and
plait's, excluded; a ``gc.collect()`` before the clock starts, in every mode, so that a full
collection owed by the imports does not land in whichever phase allocates first).

Configurations: ``frozen`` (the default under ``torch.no_grad()``: weights folded into constants,
oneDNN convolutions with fused post-ops), ``inputs`` (``freeze=False``: weights stay graph inputs,
batch norm and residual adds run as native C++ kernels) and ``frozen-interpreter`` (the inference
passes, frozen weights, plait's interpreter: the frozen guard set without oneDNN).

Usage::

    python benchmarks/cache_warm_start.py [--size 32] [--repeat 3] [--json out.json]
        [--warm-start capture fingerprint] [--speculative on off]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gc, json, sys, time, timeit
import torch
sys.path.insert(0, sys.argv[1])
from benchmarks.models.resnet import resnet18
mode, config, size, warm_start = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
speculative = sys.argv[6] == "on"
torch.manual_seed(0)
model = resnet18(num_classes=10).eval()
x = torch.randn(1, 3, size, size)
if mode == "eager":
    gc.collect()  # NOTE: the garbage imports and model building left, in every mode
    start = time.perf_counter()
    with torch.no_grad():
        model(x)
    print(json.dumps({"first_call": time.perf_counter() - start}))
    raise SystemExit
import plait
import plait.api, plait.backends, plait.runtime  # NOTE: library imports are not compile time
from plait.codegen import build
from plait.guards import GuardEnv
kwargs = {
    "frozen": {},
    "inputs": {"options": {"freeze": False}},
    "frozen-interpreter": {"backend": "eager", "options": {"passes": "inference"}},
}[config]
kwargs["options"] = {
    **kwargs.get("options", {}), "warm_start": warm_start, "speculative": speculative
}
gc.collect()  # NOTE: the garbage imports and model building left, in every mode
start = time.perf_counter()
compiled = plait.compile(model, **kwargs)
with torch.no_grad():
    out = compiled(x)
first = time.perf_counter() - start
start = time.perf_counter()
with torch.no_grad():
    compiled(x)
second = time.perf_counter() - start
spec = compiled.specializations[0]
engine = compiled._plait
with torch.no_grad():
    spec_, leaves, _ = engine.adapter.flatten((x,), {})
    env = GuardEnv(spec_, leaves, model, engine.fetch())
    assert spec.guards.holds(env)
    n = 20000
    holds = min(timeit.repeat(lambda: spec.guards.holds(env), number=n, repeat=5)) / n
    fetch = min(timeit.repeat(engine.fetch, number=n, repeat=5)) / n
    flatten = min(timeit.repeat(lambda: engine.adapter.flatten((x,), {}), number=n, repeat=5)) / n
    with torch.no_grad():
        expected = model(x)
print(json.dumps({
    "first_call": first,
    "second_call": second,
    "status": spec.manifest.cache.get("status"),
    "capture": spec.manifest.cache.get("capture"),
    "first_run": spec.manifest.cache.get("first run"),
    "compiles": build.STATS["compiles"],
    "kernels": len(spec.manifest.kernels.get("kernels", [])),
    "frozen": len(spec.manifest.graph.get("frozen", [])),
    "guards": len(spec.guards),
    "fast_guards": len(spec.guards._fast),
    "guard_evaluator": spec.guards.evaluator,
    "guard_python_reads": getattr(spec.guards.holds, "python_reads", None),
    "holds_us": holds * 1e6,
    "fetch_us": fetch * 1e6,
    "flatten_us": flatten * 1e6,
    "max_abs_err": float((out - expected).abs().max()),
    "timings": {k: v for k, v in spec.manifest.timings.items()
                if not k.startswith(("pass.", "stax.kernel."))},
}))
"""


def _child(
    mode: str, config: str, size: int, cache: Path, warm_start: str, speculative: str, **env: str
) -> dict[str, Any]:
    environ = {**os.environ, "PLAIT_CACHE_DIR": str(cache), **env}
    args = [mode, config, str(size), warm_start, speculative]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT), *args],
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode}/{config} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(
    config: str, size: int, repeat: int, warm_start: str = "capture", speculative: str = "on"
) -> dict[str, Any]:
    colds, warms, eagers = [], [], []
    common = (config, size)
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="plait-bench-cache-") as tmp:
            cache = Path(tmp)
            colds.append(_child("cold", *common, cache, warm_start, speculative))
            warms.append(
                _child("warm", *common, cache, warm_start, speculative, PLAIT_STAX_NO_COMPILE="1")
            )
        with tempfile.TemporaryDirectory() as tmp:
            eagers.append(_child("eager", *common, Path(tmp), warm_start, speculative))
    assert all(c["status"] == "miss" for c in colds) and all(w["status"] == "hit" for w in warms)
    assert all(w["compiles"] == 0 for w in warms)
    # NOTE: the default warm start captures; "fingerprint" takes the snapshot instead
    skip = "snapshot" if warm_start == "fingerprint" else "captured"
    assert all(str(w["capture"]).startswith(skip) for w in warms), warms[0]["capture"]

    def med(rows: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    cold, warm = med(colds, "first_call"), med(warms, "first_call")
    # NOTE: each repeat's warm run follows its cold one on the same cache, so the two share the
    # machine's state of the moment (its speed drifts by tens of percent on a shared host): the
    # per-repeat ratios show the spread that the ratio of medians hides.
    paired = [w["first_call"] / c["first_call"] for c, w in zip(colds, warms)]
    return {
        "config": config,
        "warm_start": warm_start,
        "speculative": speculative,
        "warm_first_run": [w["first_run"] for w in warms],
        "size": size,
        "cold_first_call_s": cold,
        "warm_first_call_s": warm,
        "warm_over_cold": warm / cold,
        "warm_over_cold_per_repeat": paired,
        "cold_first_calls_s": [c["first_call"] for c in colds],
        "warm_first_calls_s": [w["first_call"] for w in warms],
        "warm_second_call_s": med(warms, "second_call"),
        "warm_capture": warms[0]["capture"],
        "eager_first_call_s": med(eagers, "first_call"),
        "cold_compiler_invocations": colds[0]["compiles"],
        "native_kernels": colds[0]["kernels"],
        "frozen_tensors": colds[0]["frozen"],
        "guards": colds[0]["guards"],
        "fast_path_guards": colds[0]["fast_guards"],
        "guard_evaluator": colds[0]["guard_evaluator"],
        "guard_python_reads": [r["guard_python_reads"] for r in colds + warms],
        "guard_holds_us": med(warms + colds, "holds_us"),
        "state_fetch_us": med(warms + colds, "fetch_us"),
        "input_flatten_us": med(warms + colds, "flatten_us"),
        "max_abs_err_vs_eager": max(r["max_abs_err"] for r in colds + warms),
        "cold_timings": colds[len(colds) // 2]["timings"],
        "warm_timings": warms[len(warms) // 2]["timings"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| config | warm start | early first run | input | cold first call | warm first call "
        "| warm/cold | warm/cold per repeat (median, range) | eager first call | warm/eager "
        "| native kernels | guard check per call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        paired = r["warm_over_cold_per_repeat"]
        lines.append(
            f"| {r['config']} | {r['warm_start']} | {r['speculative']} "
            f"| 1x3x{r['size']}x{r['size']} "
            f"| {r['cold_first_call_s'] * 1e3:.0f} ms "
            f"| {r['warm_first_call_s'] * 1e3:.0f} ms | {r['warm_over_cold']:.1%} "
            f"| {statistics.median(paired):.1%} ({min(paired):.1%}-{max(paired):.1%}) "
            f"| {r['eager_first_call_s'] * 1e3:.0f} ms "
            f"| {r['warm_first_call_s'] / r['eager_first_call_s']:.2f}x | {r['native_kernels']} "
            f"| {r['guard_holds_us']:.1f} µs |"
        )
    return "\n".join(lines)


def _torch_version() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, nargs="+", default=[32])
    parser.add_argument("--config", nargs="+", default=["frozen", "inputs"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--warm-start", nargs="+", choices=["capture", "fingerprint"], default=["capture"]
    )
    parser.add_argument(
        "--speculative",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="the warm start's first run during capture (plait.speculative_run)",
    )
    args = parser.parse_args(argv)
    rows = [
        measure(c, s, args.repeat, w, p)
        for s in args.size
        for c in args.config
        for w in args.warm_start
        for p in args.speculative
    ]
    info = {
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": _torch_version(),
    }
    print(markdown(rows))
    print(json.dumps({"machine": info, "rows": rows}, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()

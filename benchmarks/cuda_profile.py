"""Where plait's CUDA time goes: per case, plait variants timed side by side and PyTorch's
profiler's table of the GPU kernels one call of plait runs.

    python -m benchmarks.cuda_profile --cases resnet50-fp32-b1,gpt2-6l-bf16 --out DIR
    python -m benchmarks.cuda_profile --cases resnet50-bf16-b64:plait+no-fold-bn --out DIR

Variants (each one optimisation off, see :class:`~plait.runtime.StaxOptions` and the pass
pipeline): ``plait`` (defaults), ``no-channels-last``, ``no-fold-bn``, ``no-graph``; eager and
``torch.compile(mode="reduce-overhead")`` beside them. Each is judged by the conformance gate
(two draws) and timed with CUDA events (medians over interleaved rounds). The profile lists the
kernels by total GPU time, Triton's (``triton_``) apart from the libraries'. Writes
``DIR/cuda_profile.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench import parity
from benchmarks.cuda_suite import case_named, numerics_off, to_gpu

VARIANTS: dict[str, dict[str, Any]] = {
    "plait": {},
    "no-channels-last": {"stax": {"channels_last": False}},
    "no-fold-bn": {"drop": "fold-bn"},
    "no-graph": {"cuda_graphs": False},
}


def _options(variant: dict[str, Any]) -> dict[str, Any]:
    from plait.passes import INFERENCE_PIPELINE

    options = dict(variant)
    drop = options.pop("drop", None)
    if drop is not None:
        options["passes"] = ",".join(p for p in INFERENCE_PIPELINE.split(",") if p != drop)
    return options


def _median_ms(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(3):
            fn()
    for r in range(rounds):
        names = list(fns)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {k: statistics.median(v) for k, v in times.items()}


def kernel_table(fn: Callable[[], Any], calls: int = 5, top: int = 25) -> list[dict[str, Any]]:
    """The GPU kernels ``calls`` calls of ``fn`` ran, by total time (microseconds per call)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": e.key[:90], "calls": e.count // calls, "us": us / calls})
    rows.sort(key=lambda r: -r["us"])
    triton = [r for r in rows if r["kernel"].startswith("triton_")]
    return [*rows[:top], _total("(all triton_)", triton), _total("(all)", rows)]


def _total(label: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kernel": label,
        "calls": sum(r["calls"] for r in rows),
        "us": sum(r["us"] for r in rows),
    }


def profile_case(name: str, rounds: int, variants: list[str]) -> dict[str, Any]:
    import plait

    case = case_named(name)
    model, x = case.build("full", 0)
    model, x = to_gpu(model, x, case.dtype)
    out: dict[str, Any] = {"case": name, "variants": {}, "gate": {}, "errors": {}}
    fns: dict[str, Callable[[], Any]] = {"eager": lambda: model(x)}
    compiled: dict[str, Any] = {}
    with torch.no_grad():
        for v in variants:
            try:
                c = plait.compile(model, options=_options(VARIANTS[v]))
                c(x)
                compiled[v] = c
                fns[v] = lambda c=c: c(x)
                g = parity.gate(model, c, x, module=model, draws=2, layouts=("contiguous",), seed=0)
                out["gate"][v] = {"ok": g["ok"], "worst": g.get("failures", [])[:2]}
                ex = c.specializations[0].manifest.executor
                out["variants"][v] = {
                    "cuda_graph": ex.get("cuda_graph"),
                    **ex["evidence"]["counts"],
                }
            except Exception as exc:  # NOTE: recorded, the other variants go on
                out["errors"][v] = f"{type(exc).__name__}: {exc}"[:500]
        try:
            ro = torch.compile(model, mode="reduce-overhead", dynamic=False)
            ro(x)
            fns["inductor-ro"] = lambda: ro(x)
        except Exception as exc:
            out["errors"]["inductor-ro"] = f"{type(exc).__name__}: {exc}"[:500]
        out["median_ms"] = _median_ms(fns, rounds)
        if "plait" in compiled:
            out["kernels"] = kernel_table(lambda: compiled["plait"](x))
        if "inductor-ro" in fns:
            out["inductor_kernels"] = kernel_table(fns["inductor-ro"])
    return out


def _print(result: dict[str, Any]) -> None:
    print(f"\n## {result['case']}")
    for k, v in result.get("median_ms", {}).items():
        gate = result["gate"].get(k, {}).get("ok", "-")
        print(f"  {k:18s} {v:9.3f} ms  gate={gate}  {result['variants'].get(k, '')}")
    for k, v in result["errors"].items():
        print(f"  ERROR {k}: {v}")
    for title in ("kernels", "inductor_kernels"):
        print(f"  -- {title}")
        for r in result.get(title, []):
            print(f"    {r['us']:9.1f} us  x{r['calls']:<4d} {r['kernel']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        default="resnet50-fp32-b1,resnet50-bf16-b64,gpt2-6l-bf16",
        help="comma-separated cases, each optionally CASE:VARIANT+VARIANT",
    )
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("cuda_profile: needs an NVIDIA GPU (torch.cuda.is_available() is False)")
        return 2
    numerics_off()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for spec in args.cases.split(","):
        name, _, chosen = spec.partition(":")
        variants = chosen.split("+") if chosen else args.variants.split(",")
        results.append(profile_case(name, args.rounds, variants))
        _print(results[-1])
        (args.out / "cuda_profile.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

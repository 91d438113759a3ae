"""What timing a float32 linear's library at compile time buys: eager against plait with the
timing off (``stax={"timed_matmul": False}``: every float32 linear of a constant weight without
a post-op runs MKL's packed GEMM) and on (the faster of MKL's packed GEMM and oneDNN's prepacked
linear, :mod:`plait.codegen.timed_matmul`), on the zoo's models, in one process.

Per model: the in-process first call of each plait variant (capture, passes, planning with or
without the timing, the kernel build from a warm kernel cache, the call), then the median of
``--rounds`` interleaved rounds (each system once per round) after two warm-up calls, and the
ratios to eager. Every variant's output is checked against eager within the contract's model
rule (the conformance gate, two fresh draws) before it is timed.

Usage::

    OMP_NUM_THREADS=1 python -m benchmarks.timed_linear --models hf-bert-base,hf-gpt2 \\
        --json benchmarks/out/timed_linear.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import plait
from benchmarks import zoo_models
from benchmarks.bench import parity

TRANSFORMERS = (
    "hf-bert-base,hf-gpt2,hf-distilbert-base,hf-t5-small-encoder,hf-llama-small,"
    "hf-vit-base,hf-swin-tiny,tv-vit-b-16,timm-vit-small"
)
VARIANTS = {"untimed": False, "timed": True}


def measure(name: str, rounds: int) -> dict[str, Any]:
    built = zoo_models.build(zoo_models.entry(name), quick=False, seed=0)
    model, x = built.module, built.example
    systems: dict[str, Any] = {"eager": model}
    compile_s = {}
    with torch.no_grad():
        # NOTE: a throwaway compile first: the native kernels (the same for both variants) are
        # then in the kernel cache, and the first calls below differ only by the timing
        plait.compile(model, options={"cache": False})(x)
        for label, timed in VARIANTS.items():
            compiled = plait.compile(
                model, options={"cache": False, "stax": {"timed_matmul": timed}}
            )
            start = time.perf_counter()
            compiled(x)
            compile_s[label] = time.perf_counter() - start
            verdict = parity.gate(
                model, compiled, x, module=model, draws=2, layouts=("contiguous",), seed=0
            )
            if not verdict["ok"]:
                raise SystemExit(f"{name} ({label}) failed the gate: {verdict}")
            systems[label] = compiled
        for fn in systems.values():
            fn(x), fn(x)
        times: dict[str, list[float]] = {k: [] for k in systems}
        for _ in range(rounds):
            for label, fn in systems.items():
                start = time.perf_counter()
                fn(x)
                times[label].append(time.perf_counter() - start)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "model": name,
        "ms": ms,
        "vs_eager": {k: ms["eager"] / ms[k] for k in VARIANTS},
        "first_call_s": compile_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=TRANSFORMERS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        row = measure(name, args.rounds)
        rows.append(row)
        ratios = ", ".join(f"{k} {v:.2f}x" for k, v in row["vs_eager"].items())
        firsts = ", ".join(f"{k} {v:.2f} s" for k, v in row["first_call_s"].items())
        print(f"{name}: {ratios} eager; first call {firsts}", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"threads": torch.get_num_threads(), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()

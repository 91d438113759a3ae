"""Hugging Face MobileNetV2 (MobileNetV2Config defaults, 224x224, the zoo's seeded random weights
and calibrated batch norms: :func:`benchmarks.zoo_models.build`) at one thread:
plait with its native depthwise kernel (``StaxOptions.depthwise``, the default) against plait
without it (oneDNN's depthwise convolution, the pad and ReLU6 as native kernels), and eager;
both programs compiled in one process and called interleaved, medians of ``--calls`` calls per
round, several rounds (the spread says how loaded the machine was).

Usage: ``OMP_NUM_THREADS=1 python -m benchmarks.depthwise_conv [--calls 100] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import plait


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from benchmarks.zoo_models import HF_MODELS, build

    torch.set_num_threads(1)
    (entry,) = [m for m in HF_MODELS if m.name == "hf-mobilenet-v2"]
    built = build(entry, quick=False, seed=0)
    model, x = built.module, built.example
    systems = {
        "plait depthwise": plait.compile(model, backend="stax"),
        "plait oneDNN": plait.compile(
            model, backend="stax", options={"stax": {"depthwise": False}}
        ),
        "eager": model,
    }
    with torch.no_grad():
        want = model(x)
        for name, fn in systems.items():
            got = fn(x)
            print(f"{name}: max |diff| to eager {float((got - want).abs().max()):.2e}")
        for name in ("plait depthwise", "plait oneDNN"):
            program = systems[name].specializations[0].compiled.program
            tags = program.evidence.nodes.values()
            native = sum(1 for t in tags if t.detail.startswith("native depthwise"))
            print(f"{name}: {len(program.kernels)} native kernels, {native} native depthwise calls")
        medians: dict[str, list[float]] = {k: [] for k in systems}
        for _ in range(args.rounds):
            times: dict[str, list[float]] = {k: [] for k in systems}
            for _ in range(args.calls):
                for name, fn in systems.items():
                    start = time.perf_counter()
                    fn(x)
                    times[name].append(time.perf_counter() - start)
            for name in systems:
                medians[name].append(statistics.median(times[name]) * 1e3)
            print("  ".join(f"{k} {v[-1]:.2f} ms" for k, v in medians.items()), flush=True)
    for name, ms in medians.items():
        print(
            f"{name}: median of round medians {statistics.median(ms):.2f} ms "
            f"(rounds {min(ms):.2f}-{max(ms):.2f})"
        )


if __name__ == "__main__":
    main()

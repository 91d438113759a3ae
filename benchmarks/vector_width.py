"""Stax's C++ kernels at GCC's default vector width against 512 bits, on small programs that
call math functions, in one process: each program is compiled twice (the toolchain's cache
cleared between), and the calls of eager and both variants are interleaved, so that a loaded
machine slows all three alike. Only meaningful on a CPU with AVX-512F (elsewhere the two
variants are the same build).

Usage::

    OMP_NUM_THREADS=1 python -m benchmarks.vector_width [--calls 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import plait
from plait.codegen import build

F = torch.nn.functional


def _cases() -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(512, 1024, generator=gen), torch.randn(512, 1024, generator=gen)
    w, b = torch.randn(1024, generator=gen), torch.randn(1024, generator=gen)
    xb = x.to(torch.bfloat16)
    return {
        "gelu tanh": (lambda x: F.gelu(x, approximate="tanh"), (x,)),
        "gelu erf": (lambda x: F.gelu(x), (x,)),
        "silu": (lambda x: F.silu(x), (x,)),
        "softmax": (lambda x: torch.softmax(x, -1), (x,)),
        "layer_norm": (lambda x: F.layer_norm(x, (1024,), w, b), (x,)),
        "a chain with sin and cos": (
            lambda x: ((x * 2 + 1).relu() * x - 3).abs().sqrt() + x.sin() * x.cos(),
            (x,),
        ),
        "row sum": (lambda x: x.sum(-1), (x,)),
        "bfloat16 gelu tanh": (lambda x: F.gelu(x, approximate="tanh"), (xb,)),
        "bfloat16 mul-add": (lambda x: (x * 3 + 1) * x, (xb,)),
        "tanh's backward": (lambda g, x: g * (1 - torch.tanh(x) ** 2), (g, x)),
    }


def _compiled(cases: dict[str, Any], flags: Callable[[str], tuple[str, ...]]) -> dict[str, Any]:
    default = build.vector_width_flags
    build.vector_width_flags = flags
    build.toolchain.cache_clear()
    try:
        out = {k: plait.compile(f, options={"cache": False}) for k, (f, _) in cases.items()}
        for k, (_, args) in cases.items():
            out[k](*args)  # NOTE: compiled here, under these flags
        return out
    finally:
        build.vector_width_flags = default
        build.toolchain.cache_clear()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args(argv)
    cases = _cases()
    with torch.no_grad():
        variants = {
            "256": _compiled(cases, lambda flags: ()),
            "512": _compiled(cases, build.vector_width_flags),
        }
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.calls):
            for k, (f, inputs) in cases.items():
                for name, fn in (("eager", f), *((v, c[k]) for v, c in variants.items())):
                    start = time.perf_counter()
                    fn(*inputs)
                    times.setdefault((name, k), []).append(time.perf_counter() - start)
    print("| program (512 x 1024 float32 unless noted) | eager | GCC's default width | 512 bits "
          "| default / 512 |")  # fmt: skip
    print("|---|---|---|---|---|")
    for k in cases:
        e, a, b = (statistics.median(times[(v, k)]) * 1e6 for v in ("eager", "256", "512"))
        print(f"| {k} | {e:.0f} us | {a:.0f} us | {b:.0f} us | {a / b:.2f}x |")


if __name__ == "__main__":
    main()

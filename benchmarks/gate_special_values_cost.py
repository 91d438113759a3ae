"""What the gate's special-values draw adds to a check of a compiled model.

``python -m benchmarks.gate_special_values_cost [repeats]``: plait-compiled ResNet-18 (32x32,
batch 8, eval, both layouts) and one GPT-2 block (1 x 128 x 768, with gradients), each checked
``repeats`` times with ``special_values=False`` and ``True`` alternately in one process; prints
the median seconds of each and the ratio.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import torch
from torch import nn

import plait
from plait.conformance import check
from tests.conformance.models import randn, resnet18_eval, seeded


def gpt2_block() -> nn.Module:
    from benchmarks.models.gpt2 import Block, GPT2Config

    cfg = GPT2Config(block_size=128, n_head=12, d_model=768)
    return seeded(0, lambda: Block(cfg).eval())


def cases() -> list[tuple[str, nn.Module, tuple[torch.Tensor, ...], dict[str, Any]]]:
    both = {"layouts": ("contiguous", "channels_last")}
    return [
        ("ResNet-18 32x32 b8, 2 layouts", resnet18_eval(0, 32), (randn(8, 3, 32, 32, seed=1),),
         both),
        ("GPT-2 block 1x128x768, grads", gpt2_block(), (randn(1, 128, 768, seed=1),),
         {"grads": True}),
    ]  # fmt: skip


def timed_check(
    model: nn.Module, compiled: Any, args: tuple, special: bool, **options: Any
) -> float:
    start = time.perf_counter()
    report = check(model, compiled, args, candidate_module=model, special_values=special, **options)
    seconds = time.perf_counter() - start
    assert report.ok, str(report)
    return seconds


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {repeats} repeats")
    for name, model, args, options in cases():
        compiled = plait.compile(model)
        compiled(*args)  # NOTE: the user's call: the specialization the gate judges
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for special in (False, True):
                seconds[special].append(timed_check(model, compiled, args, special, **options))
        off, on = (statistics.median(seconds[k]) for k in (False, True))
        print(f"{name}: without {off:.2f} s, with {on:.2f} s (+{on - off:.2f} s, x{on / off:.2f})")


if __name__ == "__main__":
    main()

"""Training-step benchmark: forward, backward and optimizer step, plait against eager and
torch.compile, on the CPU.

Cases: torchvision's ResNet-18 (batch 8, 112x112, 10 classes, train mode: batch statistics and
running-stat updates) and the GPT-2 style block of ``benchmarks.models.gpt2`` (batch 4, 128
tokens, d_model 256). Each system trains its own copy of the model from the same weights on the
same batches (SGD with momentum). Reported per system: the first step (capture and compile
included), the median step time over interleaved repetitions, the ratio to eager and to
torch.compile, the bytes held for the backward (every tensor saved for backward, counted once
per storage through ``torch.autograd.graph.saved_tensors_hooks``: the activation memory between
forward and backward), and the loss and the state (parameters and buffers) after the steps,
judged by the numerical contract's model rule against a float64 run of the same steps (a
system's error may exceed eager float32's by the contract's factor). For plait, the manifest
says what ran the backward.

    python -m benchmarks.training_step --out benchmarks/out/training_step.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import plait
from benchmarks.bench.config import reject_unknown
from benchmarks.bench.parity import state_after_steps

LR, MOMENTUM = 0.01, 0.9


def _resnet18() -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    from benchmarks import model_sources

    model_sources.use_torchvision()  # NOTE: torchvision's Python model definitions on the CPU
    import torchvision.models

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + k)
        return torch.randn(8, 3, 112, 112, generator=g), torch.randint(0, 10, (8,), generator=g)

    return model, batch


class _BlockHead(nn.Module):
    """A GPT-2 block and a linear head over its tokens (a loss needs logits)."""

    def __init__(self) -> None:
        super().__init__()
        from benchmarks.models.gpt2 import Block, GPT2Config

        cfg = GPT2Config(block_size=128, d_model=256, n_head=4, dropout=0.0)
        self.block = Block(cfg)
        self.head = nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x)).flatten(0, 1)


def _gpt2_block() -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = _BlockHead()

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(200 + k)
        return torch.randn(4, 128, 256, generator=g), torch.randint(0, 64, (4 * 128,), generator=g)

    return model, batch


CASES = {"resnet18-b8-112": _resnet18, "gpt2-block-b4-t128": _gpt2_block}
SYSTEMS = ("eager", "plait", "inductor")


def _build(kind: str, model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if kind == "eager":
        return model
    if kind == "plait":
        return plait.compile(model, backend="stax")
    torch._dynamo.reset()
    return torch.compile(model, backend="inductor", dynamic=False)


class _SavedBytes:
    """Bytes of the tensors saved for backward during one forward (each storage once)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        self.storages[s.data_ptr()] = s.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _step(fn: Any, opt: Any, x: torch.Tensor, y: torch.Tensor, count: _SavedBytes | None) -> float:
    opt.zero_grad(set_to_none=True)
    if count is not None:
        with torch.autograd.graph.saved_tensors_hooks(count.pack, lambda t: t):
            loss = nn.functional.cross_entropy(fn(x), y)
    else:
        loss = nn.functional.cross_entropy(fn(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def run_case(name: str, steps: int, systems: tuple[str, ...]) -> dict[str, Any]:
    model, batch = CASES[name]()
    model.train()
    anchor = copy.deepcopy(model).double()  # NOTE: the float64 trajectory the rule is anchored on
    anchor_opt = torch.optim.SGD(anchor.parameters(), lr=LR, momentum=MOMENTUM)
    runs = []
    for kind in systems:
        m = copy.deepcopy(model)
        runs.append(
            {
                "kind": kind,
                "model": m,
                "fn": _build(kind, m),
                "opt": torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM),
                "seconds": [],
                "losses": [],
            }
        )
    for k in range(steps):
        x, y = batch(k)
        _step(anchor, anchor_opt, x.double(), y, None)
        order = runs[k % len(runs) :] + runs[: k % len(runs)]  # NOTE: interleaved, rotated
        for r in order:
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r["losses"].append(_step(r["fn"], r["opt"], x, y, None))
            r["seconds"].append(time.perf_counter() - start)
            r.setdefault("warnings", sorted({str(w.message)[:200] for w in caught}))
    eager = runs[0]
    out: dict[str, Any] = {"case": name, "steps": steps, "systems": {}}
    x, y = batch(steps)
    parities = [state_after_steps(eager["model"], anchor, r["model"]) for r in runs]
    for r, parity in zip(runs, parities):
        count = _SavedBytes()
        _step(r["fn"], r["opt"], x, y, count)  # NOTE: after the parity: it moves the state
        steady = r["seconds"][1:]
        median = statistics.median(steady)
        rec: dict[str, Any] = {
            "first_step_s": r["seconds"][0],
            "median_step_ms": median * 1e3,
            "saved_bytes": count.total,
            "loss_max_abs_diff_vs_eager": max(
                abs(a - b) for a, b in zip(r["losses"], eager["losses"])
            ),
            "state_after_steps": parity,
            "warnings": r["warnings"],
        }
        if r["kind"] == "plait":
            m = r["fn"].specializations[-1].compiled.manifest
            rec["backward"] = "compiled (stax)" if m.autograd else "eager autograd"
            rec["partition"] = {k: m.autograd.get(k) for k in ("partitioner", "saved_bytes")}
            rec["fallbacks"] = m.fallbacks
        out["systems"][r["kind"]] = rec
    base = out["systems"]["eager"]["median_step_ms"]
    ind = out["systems"].get("inductor", {}).get("median_step_ms")
    for rec in out["systems"].values():
        rec["speedup_vs_eager"] = base / rec["median_step_ms"]
        if ind:
            rec["speedup_vs_inductor"] = ind / rec["median_step_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    cases, systems = args.cases.split(","), tuple(args.systems.split(","))
    reject_unknown(ap, "case", cases, tuple(CASES))
    reject_unknown(ap, "system", systems, tuple(SYSTEMS))
    results = {
        "machine": {"torch": torch.__version__, "threads": torch.get_num_threads()},
        "cases": [run_case(c, args.steps, systems) for c in cases],
    }
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

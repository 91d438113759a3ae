"""The training phase: a few SGD steps of each compiled model, side by side with eager.

Each system trains its own copy of the benchmark model (same weights, same batches in the same
order, SGD with momentum, cross-entropy); steps are interleaved across systems. Step 0 includes
capture and compile and is reported apart; step throughput is from the remaining steps. Before
the first step the gate judges each compiled training step against eager (``grads=True``:
outputs, BatchNorm running-statistic updates, parameter gradients). After the steps the state
(parameters and buffers) is judged by the contract's model rule against a float64 run of the
same steps (:func:`benchmarks.bench.parity.state_after_steps`: a trajectory amplifies rounding,
so the bound is eager float32's own error, the larger of its contiguous and channels_last runs'
errors); the loss curve and the largest difference from eager's parameters are displayed beside
it.

Where the forward and the backward actually ran is read from plait's manifest, never assumed: a
compiled backward is recorded there (``executor["backward"]``, ``autograd``: the partition and
the bytes saved); a backward that could not be compiled runs in eager autograd with a recorded
fallback, and the phase says so.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from benchmarks.bench import parity, systems, timing
from benchmarks.bench.config import BenchConfig
from benchmarks.bench.data import ImageSet
from plait.progress import Progress

LR = 0.01
MOMENTUM = 0.9


def _executors(system: systems.System) -> dict[str, Any]:
    if system.kind == "eager":
        return {"forward": "eager PyTorch", "backward": "eager autograd", "statement": None}
    if system.kind == "inductor":
        return {
            "forward": "inductor (AOTAutograd forward graph)",
            "backward": "inductor (AOTAutograd backward graph)",
            "statement": None,
        }
    summary = systems.manifest_summary(system.compiled) or {}
    forward = "stax native kernels"
    if summary.get("backend") != "stax":
        forward = "plait reference interpreter (PyTorch ops, no native kernels)"
    manifest = system.compiled.specializations[-1].manifest
    compiled_bwd = (manifest.executor or {}).get("backward")
    backward = "eager autograd"
    if compiled_bwd:
        counts = compiled_bwd.get("evidence", {}).get("counts", {})
        saved = manifest.autograd.get("saved_bytes")
        backward = f"stax backward program ({counts}; {saved} bytes saved for it)"
    return {
        "forward": forward,
        "backward": backward,
        "statement": f"backward ran in {backward}" if not compiled_bwd else None,
        "fallbacks": summary.get("fallbacks", []),
    }


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _diff(a: nn.Module, b: nn.Module) -> dict[str, Any]:
    ta, tb = _tensors(a), _tensors(b)
    worst: dict[str, Any] = {"max_abs": 0.0, "max_rel": 0.0, "where": None}
    for name, t in ta.items():
        if not t.is_floating_point():
            continue
        e = parity.errors(tb[name], t)
        if e["max_abs"] > worst["max_abs"]:
            worst = {**e, "where": name}
    return worst


def run(cfg: BenchConfig, model: nn.Module, data: ImageSet, progress: Progress) -> dict[str, Any]:
    """The training phase on the CPU (see the module docstring)."""
    batches = [data.batch(k, cfg.train_batch) for k in range(cfg.train_steps)]
    runs: list[dict[str, Any]] = []
    kinds = ["eager", *(k for k in cfg.train_systems if k != "eager")]
    for kind in kinds:
        m = copy.deepcopy(model).train()
        system = systems.build(kind, m, "cpu")
        opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
        runs.append({"system": system, "opt": opt, "losses": [], "seconds": []})
    eager = runs[0]["system"].model
    anchor = copy.deepcopy(model).train().double()  # NOTE: the float64 run the state is judged by
    anchor_opt = torch.optim.SGD(anchor.parameters(), lr=LR, momentum=MOMENTUM)
    # NOTE: eager again in channels_last (oneDNN's other algorithms): the spread of eager's own
    # rounding the state is judged by, beside eager's contiguous run
    spread = copy.deepcopy(model).train().to(memory_format=torch.channels_last)
    spread_opt = torch.optim.SGD(spread.parameters(), lr=LR, momentum=MOMENTUM)
    gates: dict[str, Any] = {}
    with progress.task("training: gate (grads)", total=len(runs) - 1) as advance:
        for r in runs[1:]:
            s = r["system"]
            with systems.recording(s):
                gates[s.name] = parity.gate(
                    eager,
                    s.fn,
                    batches[0][0],
                    module=s.model,
                    draws=cfg.gate_draws,
                    layouts=("contiguous",),
                    seed=cfg.seed,
                    grads=True,
                )
            advance(note=s.name)
    loss_fn = nn.CrossEntropyLoss()
    with progress.task("training: SGD steps", total=cfg.train_steps) as advance:
        for k, (x, y) in enumerate(batches):
            anchor_opt.zero_grad(set_to_none=True)
            loss_fn(anchor(x.double()), y).backward()
            anchor_opt.step()
            spread_opt.zero_grad(set_to_none=True)
            loss_fn(spread(x.to(memory_format=torch.channels_last)), y).backward()
            spread_opt.step()
            order = runs[k % len(runs) :] + runs[: k % len(runs)]
            for r in order:
                s, opt = r["system"], r["opt"]

                def step(
                    s: systems.System = s, opt: Any = opt, x: torch.Tensor = x, y: Any = y
                ) -> float:
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn(s.fn(x), y)
                    loss.backward()
                    opt.step()
                    return float(loss.detach())

                with systems.recording(s):
                    seconds, loss = timing.timed(step, "cpu")
                r["seconds"].append(seconds)
                r["losses"].append(loss)
            advance(note=f"step {k}")
    out = []
    for r in runs:
        s = r["system"]
        steady = r["seconds"][1:]
        lat = timing.summarize(steady)
        eager_losses = runs[0]["losses"]
        out.append(
            {
                "system": s.name,
                "kind": s.kind,
                "first_step_s": r["seconds"][0],
                "step_latency": lat,
                "steps_per_s": 1e3 / lat["p50_ms"],
                "images_per_s": cfg.train_batch * 1e3 / lat["p50_ms"],
                "losses": r["losses"],
                "loss_max_abs_diff_vs_eager": max(
                    abs(a - b) for a, b in zip(r["losses"], eager_losses)
                ),
                "params_vs_eager": _diff(eager, s.model),
                "state_after_steps": parity.state_after_steps(
                    eager, anchor, s.model, spread=[spread]
                ),
                "executors": _executors(s),
                "gate": gates.get(s.name),
                "warnings": s.warnings,
            }
        )
    return {
        "device": "cpu",
        "steps": cfg.train_steps,
        "batch_size": cfg.train_batch,
        "optimizer": f"SGD(lr={LR}, momentum={MOMENTUM})",
        "loss": "cross-entropy on the digit labels",
        "systems": out,
    }

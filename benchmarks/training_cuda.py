"""Training-step benchmark on one NVIDIA GPU: forward, backward and optimizer step under bf16
autocast, plait against eager and torch.compile in the same run.

Cases: torchvision ResNet-50 (batch 64, 224x224, 1000 classes, train mode: batch statistics and
running-stat updates) and a 6-layer Hugging Face GPT-2 language model (batch 8, 512 tokens,
dropout off so that every system draws nothing random). Weights stay float32; the step runs under
``torch.autocast("cuda", dtype=torch.bfloat16)``; SGD with momentum. Each system trains its own
copy from the same weights on the same batches. Per system: the first step (capture and compile
included), the median wall time of a synchronized step over interleaved rounds (one step of each
system per round, the order rotating), the ratios to eager and to torch.compile, the CUDA
allocator's peak over one step, what the system holds between steps beyond the model and its
optimizer (``held``: measured at the end, as what deleting the compiled callable frees; a CUDA
graph's buffers and pools), and the parameters and buffers after the steps judged by the
contract's model rule (bfloat16 factors) against a float64 run of the same steps without
autocast. For plait, what ran the backward (the manifest).

    python -m benchmarks.training_cuda --out DIR [--cases resnet50-bf16-b64,gpt2-6l-bf16]
        [--steps 12] [--quick]
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
from benchmarks.cuda_suite import import_torchvision

LR, MOMENTUM = 0.01, 0.9
DTYPE = torch.bfloat16
Batch = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def _resnet50(quick: bool) -> tuple[nn.Module, Batch, Callable[[Any, Any], Any]]:
    import_torchvision()
    import torchvision.models

    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    n, size = (8, 64) if quick else (64, 224)

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + k)
        return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 1000, (n,), generator=g)

    return model, batch, nn.functional.cross_entropy


class _LMLogits(nn.Module):
    """A Hugging Face causal LM reduced to its logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(0, 1)
    )


def _gpt2(quick: bool) -> tuple[nn.Module, Batch, Callable[[Any, Any], Any]]:
    import transformers

    cfg = transformers.GPT2Config(
        n_layer=2 if quick else 6, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = _LMLogits(transformers.GPT2LMHeadModel(cfg))
    b, t = (2, 128) if quick else (8, 512)

    def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, cfg.vocab_size, (b, t), generator=torch.Generator().manual_seed(k))
        return ids, ids

    return model, batch, _next_token_loss


CASES = {"resnet50-bf16-b64": _resnet50, "gpt2-6l-bf16": _gpt2}
SYSTEMS = ("eager", "plait", "inductor")
KNOWN_SYSTEMS = (*SYSTEMS, "plait-copies", "plait-own-pools")


def _build(kind: str, model: nn.Module) -> Any:
    if kind == "eager":
        return model
    if kind == "plait":
        return plait.compile(model)
    if kind == "plait-copies":  # NOTE: the ablation: saved values copied between the graphs
        return plait.compile(model, options={"stax": {"cuda_handoff": False}})
    if kind == "plait-own-pools":  # NOTE: the ablation: the backward's graph in a pool of its own
        return plait.compile(model, options={"stax": {"cuda_shared_pool": False}})
    assert kind == "inductor", kind
    torch._dynamo.reset()
    return torch.compile(model, dynamic=False)


def _step(fn: Any, opt: Any, loss_fn: Any, x: torch.Tensor, y: torch.Tensor, amp: bool) -> float:
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=DTYPE, enabled=amp):
        loss = loss_fn(fn(x), y)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _timed_step(r: dict[str, Any], loss_fn: Any, x: torch.Tensor, y: torch.Tensor) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    r["losses"].append(_step(r["fn"], r["opt"], loss_fn, x, y, True))  # NOTE: float() syncs
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _profile(r: dict[str, Any], loss_fn: Any, x: torch.Tensor, y: torch.Tensor) -> str:
    """torch.profiler's table of one step's CUDA kernels, by total GPU time (top 45); then,
    from a second step with the host's ops and their input shapes, the ops outside CUDA graphs
    that launched the most GPU time (top 20: which copy is whose)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _step(r["fn"], r["opt"], loss_fn, x, y, True)
        torch.cuda.synchronize()
    kernels = prof.key_averages().table(sort_by="cuda_time_total", row_limit=45)
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=acts, record_shapes=True) as prof:
        _step(r["fn"], r["opt"], loss_fn, x, y, True)
        torch.cuda.synchronize()
    ops = prof.key_averages(group_by_input_shape=True).table(
        sort_by="cuda_time_total", row_limit=20, max_name_column_width=40,
        max_shapes_column_width=70,
    )  # fmt: skip
    return f"{kernels}\n{ops}"


def run_case(
    name: str, steps: int, quick: bool, systems: tuple[str, ...], profiled: bool = False
) -> dict[str, Any]:
    model, batch, loss_fn = CASES[name](quick)
    model.train()
    anchor = copy.deepcopy(model).double().cuda()  # NOTE: the float64 trajectory, no autocast
    anchor_opt = torch.optim.SGD(anchor.parameters(), lr=LR, momentum=MOMENTUM)
    runs = []
    for kind in systems:
        m = copy.deepcopy(model).cuda()
        opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
        runs.append({"kind": kind, "model": m, "fn": _build(kind, m), "opt": opt,
                     "seconds": [], "losses": []})  # fmt: skip
    for k in range(steps):
        x, y = (t.cuda() for t in batch(k))
        x64 = x.double() if x.is_floating_point() else x
        _step(anchor, anchor_opt, loss_fn, x64, y, False)
        for r in runs[k % len(runs) :] + runs[: k % len(runs)]:  # NOTE: interleaved, rotated
            if r.get("error"):
                continue
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    r["seconds"].append(_timed_step(r, loss_fn, x, y))
            except Exception as exc:  # NOTE: recorded in this system's cell; the others go on
                r["error"] = f"step {k}: {type(exc).__name__}: {str(exc)[:600]}"
                print(f"[training_cuda] {name} {r['kind']}: ERROR {r['error']}", flush=True)
                continue
            r.setdefault("warnings", sorted({str(w.message)[:200] for w in caught}))
        print(f"[training_cuda] {name} step {k} done", flush=True)
    eager = runs[0]
    out: dict[str, Any] = {"case": name, "steps": steps, "quick": quick, "systems": {}}
    for r in runs:
        if r.get("error"):
            out["systems"][r["kind"]] = {"error": r["error"]}
            continue
        rec: dict[str, Any] = {
            "first_step_s": r["seconds"][0],
            "median_step_ms": statistics.median(r["seconds"][2:]) * 1e3,
            "loss_max_abs_diff_vs_eager": max(
                abs(a - b) for a, b in zip(r["losses"], eager["losses"])
            ),
            "state_after_steps": state_after_steps(eager["model"], anchor, r["model"], DTYPE),
            "warnings": r.get("warnings", []),
        }
        x, y = (t.cuda() for t in batch(steps))
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _step(r["fn"], r["opt"], loss_fn, x, y, True)  # NOTE: after the parity: it moves the state
        torch.cuda.synchronize()
        rec["step_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        if profiled:  # NOTE: after the parity: it moves the state
            rec["profile"] = _profile(r, loss_fn, x, y)
            print(f"[training_cuda] {name} {r['kind']} profile\n{rec['profile']}", flush=True)
        if r["kind"].startswith("plait"):
            m = r["fn"].specializations[-1].compiled.manifest
            rec["backward"] = "compiled" if m.autograd else "eager autograd"
            rec["target"] = m.executor.get("target")
            rec["backend_choice"] = m.options.get("backend_choice")
            rec["partition"] = {k: m.autograd.get(k) for k in ("partitioner", "saved_bytes")}
            rec["fallbacks"] = m.fallbacks[:10]
            rec["timings"] = {k: round(v, 3) for k, v in m.timings.items()}
            rec["cuda_graphs"] = _found(m.to_json(), "cuda_graph")
            program = r["fn"].specializations[-1].compiled.program
            if hasattr(program, "backward"):  # NOTE: the live records (calls counted so far)
                rec["cuda_graph_calls"] = {
                    half: getattr(program, half).cuda_graph for half in ("forward", "backward")
                }
                calls = json.dumps(rec["cuda_graph_calls"], default=str)
                print(f"[training_cuda] {name} {r['kind']} cuda graphs: {calls}", flush=True)
            del m, program  # NOTE: no reference left for _held_mib's deletion to miss
        out["systems"][r["kind"]] = rec
    for r in runs:  # NOTE: last: each system's callable is deleted
        if "median_step_ms" in out["systems"][r["kind"]]:
            out["systems"][r["kind"]]["held_mib"] = _held_mib(r)
    ok = {k: v for k, v in out["systems"].items() if "median_step_ms" in v}
    base_ms = ok.get("eager", {}).get("median_step_ms")
    ind = ok.get("inductor", {}).get("median_step_ms")
    for rec in ok.values():
        if base_ms:
            rec["speedup_vs_eager"] = base_ms / rec["median_step_ms"]
        if ind:
            rec["speedup_vs_inductor"] = ind / rec["median_step_ms"]
    return out


def _held_mib(r: dict[str, Any]) -> float:
    """What deleting the system's compiled callable frees: what it holds between steps beyond
    the model and the optimizer (CUDA graphs' static buffers, saved-value buffers, pools)."""
    import gc

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    r["fn"] = None
    gc.collect()
    torch.cuda.synchronize()
    return (before - torch.cuda.memory_allocated()) / 2**20


def table(results: dict[str, Any]) -> str:
    """The Markdown table of a run: one row per case and system."""
    rows = ["| case | system | first step s | step ms | vs eager | vs torch.compile "
            "| step peak MiB | held MiB | state within contract |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for case in results["cases"]:
        for kind, rec in case["systems"].items():
            if "error" in rec:
                rows.append(f"| {case['case']} | {kind} | error: {rec['error'][:120]} ||||||||")
                continue
            rows.append(
                f"| {case['case']} | {kind} | {rec['first_step_s']:.1f} | "
                f"{rec['median_step_ms']:.2f} | {_ratio(rec.get('speedup_vs_eager'))} | "
                f"{_ratio(rec.get('speedup_vs_inductor'))} | {rec['step_peak_mib']:.0f} | "
                f"{rec.get('held_mib', float('nan')):.0f} | "
                f"{rec['state_after_steps']['within_contract']} |"
            )
    return "\n".join(rows)


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"  # NOTE: no such system in the run


def _found(doc: Any, key: str, path: str = "") -> dict[str, Any]:
    """Every value under ``key`` in a nested manifest record, by its path."""
    out: dict[str, Any] = {}
    items = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    )
    for k, v in items:
        here = f"{path}/{k}"
        if k == key:
            out[here] = v
        else:
            out.update(_found(v, key, here))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--quick", action="store_true", help="smaller batches and models")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", action="store_true", help="profile one step of each system")
    args = ap.parse_args(argv)
    cases, systems = args.cases.split(","), tuple(args.systems.split(","))
    reject_unknown(ap, "case", cases, tuple(CASES))
    reject_unknown(ap, "system", systems, tuple(KNOWN_SYSTEMS))
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results: dict[str, Any] = {
        "machine": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()},
        "cases": [],
    }
    for c in cases:
        results["cases"].append(run_case(c, args.steps, args.quick, systems, args.profile))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "training_cuda.json").write_text(json.dumps(results, indent=2, default=str))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

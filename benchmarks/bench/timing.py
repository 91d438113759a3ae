"""Clocks, percentiles, memory high-water marks and the facts about the machine.

Timing rules (the benchmark's, documented in docs/benchmark.md): ``torch.set_num_threads`` fixed
and recorded, warm-up calls first, then interleaved repetitions (the systems' order rotates each
repetition), one call per sample, on CUDA a synchronize before and after each timed call.

Example:
    >>> summarize([3.0, 1.0, 2.0])["p50_ms"]
    2000.0
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Seconds one call of ``fn`` takes (synchronized on CUDA) and its result."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(seconds: list[float]) -> dict[str, Any]:
    """Latency statistics in milliseconds."""
    ms = [s * 1e3 for s in seconds]
    return {
        "samples": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "mean_ms": sum(ms) / len(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


# --- memory ----------------------------------------------------------------------------------
def _status(key: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def rss() -> int | None:
    return _status("VmRSS")


def rss_peak() -> int | None:
    return _status("VmHWM")


def reset_rss_peak() -> bool:
    """Reset the process's RSS high-water mark to its current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# --- the machine -------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def _git() -> dict[str, Any]:
    def run(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()

    try:
        return {"commit": run("rev-parse", "HEAD") or None, "dirty": bool(run("status", "-s"))}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _cxx() -> str | None:
    try:
        from plait.codegen.build import toolchain

        rec = toolchain().record()
        return str(rec.get("version") or rec.get("cxx") or rec)
    except Exception:  # NOTE: machine facts are best effort; never fail a run over them.
        return None


def environment(threads: int) -> dict[str, Any]:
    """Machine, software and load facts recorded with every run."""
    import plait

    cuda = None
    if torch.cuda.is_available():
        cuda = {
            "device": torch.cuda.get_device_name(0),
            "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
        }
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 1
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "plait": plait.__version__,
        "cxx": _cxx(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "cpu_affinity": affinity,
        "threads": threads,
        "interop_threads": torch.get_num_interop_threads(),
        "load_average_start": list(os.getloadavg()),
        "load_average_end": None,
        "cuda": cuda,
        "tf32": {
            "cuda_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "cudnn": bool(torch.backends.cudnn.allow_tf32),
        },
        "git": _git(),
    }

"""Compile cost and memory in a fresh process: ``python -m benchmarks.bench.worker SPEC OUT``.

The parent writes a JSON spec (system kind, device, options, model, image size, batch size,
threads, seed, data) and runs this module in a new interpreter with the cache directories it
chooses: an empty ``PLAIT_CACHE_DIR``/``TORCHINDUCTOR_CACHE_DIR`` for a cold compile, the same
directories again for a warm one. The worker imports the compiler's modules first (timed apart,
``imports_s``), builds the same model and first batch, then times the wrapper call
(``plait.compile(...)``, ``torch.compile(...)``) and the first call (capture + compile + one
run), and measures memory: the RSS high-water mark over the compile, and the peak RSS over a few
steady-state calls (``VmHWM`` reset after the compile), both as growth over the RSS once the
model and its input exist (so compiled constants, kernels and activations count, the compile's
transient peak does not in the steady figure); on CUDA the allocator's peak.

Example (``run_worker(spec, env, timeout)`` runs one; the test suite runs it for real):
    >>> _sub(7, 3), _sub(None, 3)
    (4, None)
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

STEADY_CALLS = 3


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """What one fresh process measures for one system (see the module docstring)."""
    import torch

    import plait  # noqa: F401  (imports are part of the process cost, not of the compile)
    from benchmarks.bench import systems, timing
    from benchmarks.bench.data import build_model, load_images

    systems.preimport([spec["kind"]])
    imports_s = time.perf_counter() - _START
    torch.set_num_threads(int(spec["threads"]))
    device = spec["device"]
    data = load_images(int(spec["image_size"]), spec["data"])
    model = build_model(spec["model"], int(spec["seed"]), data).to(device)
    x = data.batch(0, int(spec["batch_size"]))[0].to(device)
    rss_setup = timing.rss()
    sync = lambda: timing.sync(device)
    with torch.no_grad():
        system = systems.build(spec["kind"], model, device, spec.get("options") or {})
        systems.first_call(system, x, sync)
        compile_hwm = timing.rss_peak()
        second_s, _ = timing.timed(lambda: system.fn(x), device)
        reset = timing.reset_rss_peak()
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        for _ in range(STEADY_CALLS):
            system.fn(x)
        timing.sync(device)
        steady_hwm = timing.rss_peak() if reset else None
    out: dict[str, Any] = {
        "imports_s": imports_s,
        "wrapper_s": system.wrapper_s,
        "first_call_s": system.first_call_s[int(x.shape[0])],
        "second_call_s": second_s,
        "rss_setup_bytes": rss_setup,
        "compile_peak_rss_bytes": compile_hwm,
        "compile_rss_growth_bytes": _sub(compile_hwm, rss_setup),
        "steady_peak_rss_growth_bytes": _sub(steady_hwm, rss_setup),
        "cuda_peak_allocated_bytes": (
            torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
        ),
        "codegen": systems.manifest_summary(system.compiled),
        "warnings": system.warnings,
    }
    return out


def _sub(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def run_worker(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run :func:`measure` in a new interpreter with ``env`` added; the measurements, or
    ``{"error": ...}`` when the process failed."""
    from benchmarks.bench.timing import ROOT

    with tempfile.TemporaryDirectory(prefix="plait-bench-worker-") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        full_env = dict(os.environ)
        full_env.update(env)
        full_env["OMP_NUM_THREADS"] = str(spec["threads"])
        full_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        )
        cmd = [sys.executable, "-m", "benchmarks.bench.worker", str(spec_path), str(out_path)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        wall = time.perf_counter() - start
        if proc.returncode != 0 or not out_path.exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            last = lines[-1] if lines else "no output"
            tail = " | ".join(lines[-12:-1])
            return {"error": f"exit {proc.returncode}: {last} (traceback tail: {tail})"[:4000]}
        result: dict[str, Any] = json.loads(out_path.read_text())
        result["process_wall_s"] = wall
        return result


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(measure(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Triton compile workers (plait.triton_worker, plait.codegen.triton_pool): a worker compiles one
of plait's printed kernels for a CUDA target under the very key a compiling process computes,
keeps serving after a request fails (started again where it died), and the pool keeps workers
only while Triton's environment holds.

No GPU is needed: Triton compiles for a given target without one (the launcher, which links
libcuda, is left out here; tests/gpu/test_triton_backend.py builds it on a GPU)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

# NOTE: before Triton is imported: Triton and plait's helpers decorated from here on run in its
# interpreter, as the other Triton tests of this process expect (one process does not mix the
# two: kernels compile in the child processes below)
os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)

from plait import triton_worker
from plait.codegen import triton_pool
from plait.codegen.fusion import plan_graph
from plait.codegen.triton import print_triton
from plait.codegen.triton_text import TritonSource
from plait.ir import GraphBuilder, TensorType

TARGET = ("cuda", 90, 32)

# NOTE: a process that compiles (this one interprets), on a driver that answers TARGET: what a
# worker is sent for the kernel (plait.codegen.triton_pool._spec_of, read from the compile
# Triton submits) and the key this process compiles it under, pickled to a file
COMPILING_CHILD = """
import json, pickle, sys, torch
from concurrent.futures import ThreadPoolExecutor
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime._async_compile import AsyncCompileMode
from plait import triton_worker
from plait.codegen import triton_pool

class Device(triton_worker._TargetOnly):
    def get_current_stream(self, device):
        return 0

class Capture(AsyncCompileMode):
    def submit(self, key, compile_fn, finalize_fn):
        seen["spec"] = triton_pool._spec_of(compile_fn)
        seen["key"] = compile_fn().hash
        return None

path, name, symbol, grid, warps, target, out = json.loads(sys.argv[1])
driver.set_active(Device(GPUTarget(*target)))
seen = {}
fn = triton_worker._kernel(path, name, symbol)
with ThreadPoolExecutor(1) as local, Capture(local):
    fn.warmup(torch.float32, torch.float32, grid=tuple(grid), num_warps=warps)
with open(out, "wb") as f:
    pickle.dump(seen, f)
"""


def _printed(tmp_path: Path, name: str) -> tuple[Path, TritonSource]:
    """A kernel of a plan (exp(x * sigmoid(x)), float32), printed by plait, in its module file."""
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4096,), torch.float32))
    gb.output(gb.call("exp", gb.call("mul", x, gb.call("sigmoid", x))))
    (low,) = plan_graph(gb.build()).kernels
    ts = print_triton(low.kernel, "k")
    path = tmp_path / f"{name}.py"
    path.write_text(ts.source)
    return path, ts


def _spec_and_key(tmp_path: Path, path: Path, name: str, ts: TritonSource) -> tuple[dict, str]:
    """What a worker is sent for the kernel, and the key a compiling process compiles it
    under."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "here"),
           "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root)])}  # fmt: skip
    out = tmp_path / "seen.pickle"
    args = json.dumps([str(path), name, ts.symbol, list(ts.grid), ts.num_warps, TARGET, str(out)])
    proc = subprocess.run([sys.executable, "-c", COMPILING_CHILD, args], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = pickle.loads(out.read_bytes())
    assert seen["spec"] is not None, "plait could not read Triton's compile"
    return seen["spec"], seen["key"]


def _ask(pool: triton_pool.WorkerPool, request: dict[str, Any]) -> dict[str, Any]:
    done = threading.Event()
    reply: dict[str, Any] = {}

    def answer(r: dict[str, Any]) -> None:
        reply.update(r)
        done.set()

    pool.submit(request, answer)
    assert done.wait(120), "the worker did not answer"
    return reply


def test_framing_round_trips_and_the_empty_message_ends() -> None:
    import io

    buf = io.BytesIO()
    triton_worker.write_message(buf, {"hash": "x" * 70000})
    triton_worker.write_message(buf, None)
    buf.seek(0)
    assert triton_worker.read_message(buf) == {"hash": "x" * 70000}
    assert triton_worker.read_message(buf) is None


def test_a_worker_compiles_under_the_compiling_processs_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "plait_triton_pool_test_a"
    path, ts = _printed(tmp_path, name)
    spec, key = _spec_and_key(tmp_path, path, name, ts)
    elsewhere = tmp_path / "worker-cache"
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # NOTE: the environment the workers start in
    pool = triton_pool.WorkerPool(triton_pool.identity(os.environ), TARGET)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    try:
        pool.grow(1)
        base = dict(spec)
        env = {"TRITON_CACHE_DIR": str(elsewhere), "TRITON_INTERPRET": "0"}
        broken = _ask(pool, {**base, "path": str(tmp_path / "missing.py"), "target": TARGET,
                             "env": env, "launcher": False})  # fmt: skip
        assert "missing.py" in broken["error"]
        dying = tmp_path / "dies.py"
        dying.write_text("import os\nos._exit(3)\n")
        died = _ask(pool, {**base, "path": str(dying), "module": "plait_triton_pool_test_dies",
                           "target": TARGET, "env": env})  # fmt: skip
        assert died == {"error": "the worker exited (status 3)"}
        reply = _ask(pool, {**base, "target": TARGET, "env": env, "launcher": False})
    finally:
        pool.close()
    assert reply["hash"] == key and reply["compile_s"] > 0, reply
    # NOTE: it compiled (the cache it was given was empty): the kernel's group is there
    assert any(elsewhere.glob("*/__grp__*.json"))


def test_the_pool_is_replaced_when_tritons_environment_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(triton_pool, "_POOL", None)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a"))
    first = triton_pool.pool(TARGET)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "b"))
    assert triton_pool.pool(TARGET) is first  # NOTE: the cache directory travels with each request
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "ptxas"))
    second = triton_pool.pool(TARGET)
    assert second is not first and second.identity["TRITON_PTXAS_PATH"] == str(tmp_path / "ptxas")
    second.close()


def test_an_error_before_the_dispatch_still_answers_every_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel waiting for the workers is compiled here when the compile stops before its
    dispatch, the error goes on, and no compile mode is left active."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from triton.runtime._async_compile import active_mode

    monkeypatch.setattr(triton_pool, "_held", lambda key: False)
    monkeypatch.setattr(triton_pool, "_spec_of", lambda fn: {"symbol": "k"})
    compiled: list[str] = []

    def compile_fn() -> Any:
        compiled.append("here")
        return SimpleNamespace(hash="h")

    mode_class = triton_pool._mode_class()
    with (
        ThreadPoolExecutor(1) as local,
        pytest.raises(RuntimeError, match="before dispatch"),
        mode_class(local, 4, TARGET) as mode,
    ):
        kernel = mode.submit("key", compile_fn, lambda k: None)
        raise RuntimeError("before dispatch")
    assert compiled == ["here"] and kernel.result().hash == "h"
    assert active_mode.get() is None


def test_a_worker_reply_whose_kernel_is_missing_here_is_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that says it compiled a kernel this process's cache does not hold (another
    cache directory) is recorded, and the kernel compiles here."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    monkeypatch.setattr(triton_pool, "_held", lambda key: False)
    mode_class = triton_pool._mode_class()
    with ThreadPoolExecutor(1) as local:
        mode = mode_class(local, 4, TARGET)
        w = triton_pool._Waiting("k1", {"symbol": "k"}, lambda: SimpleNamespace(hash="h"))
        mode._finish(w, {"hash": "h", "compile_s": 0.1, "launcher_s": 0.0})
    assert w.future.result().hash == "h"
    assert mode.errors() == [
        "k: its kernel is not in this process's Triton cache (the worker compiled under key h, "
        "this process looks under k1)"
    ]

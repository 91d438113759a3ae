"""The artifact cache across processes: a warm start captures nothing and runs no pass, no
planner dry run and no C++ compiler, and gives the cold answer bit for bit; several processes
compiling the same model at once into one cache all answer right and leave one entry that
verifies clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plait.cache import LocalStore
from tests.cache.helpers import convnet, sample

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys, warnings
warnings.simplefilter("error")
import torch
import plait
from plait.codegen import build
from tests.cache.helpers import convnet, sample
mode = sys.argv[1]
if mode == "warm":
    import plait.api
    import plait.backends
    from plait.codegen.probing_oracle import ProbingOracle

    def refuse(*args, **kwargs):
        raise AssertionError("a pass ran on a warm start")

    plait.backends.run_pipeline = refuse

    def no_capture(*args, **kwargs):
        raise AssertionError("a warm start captured the program")

    plait.api.capture_program = no_capture
    real = ProbingOracle._dry_run

    def dry_run(self, step, *args):
        if self._recorded is None:
            raise AssertionError("the planner ran an extern on zeros on a warm start")
        return real(self, step, *args)

    ProbingOracle._dry_run = dry_run
compiled = plait.compile(convnet(), options={"warm_start": "fingerprint"})
with torch.no_grad():
    out = compiled(sample())
spec = compiled.specializations[0]
print(json.dumps({
    "status": spec.manifest.cache["status"],
    "capture": spec.manifest.cache["capture"],
    "out": out.flatten().tolist(),
    "compiles": build.STATS["compiles"],
    "kernels": len(spec.manifest.kernels.get("kernels", [])),
    "timings": spec.manifest.timings,
}))
"""


def _child(cache: Path, mode: str, **env: str) -> subprocess.Popen[str]:
    environ = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_warm_start_runs_no_pass_and_no_compiler(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = _result(_child(cache, "cold"))
    assert cold["status"] == "miss" and cold["kernels"] > 0 and cold["compiles"] > 0
    warm = _result(_child(cache, "warm", PLAIT_STAX_NO_COMPILE="1"))
    assert warm["status"] == "hit" and warm["compiles"] == 0
    assert warm["capture"].startswith("snapshot"), warm["capture"]
    assert cold["capture"].startswith("captured") and "saved" in cold["capture"]
    assert warm["out"] == cold["out"]  # NOTE: bit for bit (JSON floats round-trip exactly)
    assert "passes" not in warm["timings"] and "cache.rebuild" in warm["timings"]


@pytest.mark.slow
def test_processes_compiling_at_once_share_one_consistent_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    procs = [_child(cache, "cold") for _ in range(4)]
    results = [_result(p) for p in procs]
    assert all(r["out"] == results[0]["out"] for r in results)
    with torch.no_grad():
        expected = convnet()(sample()).flatten()
    torch.testing.assert_close(torch.tensor(results[0]["out"]), expected)
    assert {r["status"] for r in results} <= {"miss", "hit"}
    store = LocalStore(cache / "artifacts")
    report = store.verify()
    assert report.ok, report
    kinds = sorted(str(e.meta.get("kind", "artifact")) for e in store.list())
    # NOTE: one of each, however many wrote them
    assert kinds == ["artifact", "first-run hint", "snapshot"]
    warm = _result(_child(cache, "warm", PLAIT_STAX_NO_COMPILE="1"))
    assert warm["status"] == "hit" and warm["out"] == results[0]["out"]

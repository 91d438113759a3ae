"""On a GPU machine, compiling and running a CPU program (cold and warm, through the artifact
cache) never starts CUDA: asking CUDA anything starts its driver (about 0.2 s) and a context
(GPU memory), which a CPU program's warm start must not pay for. Skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, torch, plait
from tests.cache.helpers import convnet, sample
model = convnet()
compiled = plait.compile(model)
with torch.no_grad():
    out = compiled(sample())
    expected = model(sample())
spec = compiled.specializations[0]
print(json.dumps({
    "cuda_initialized": torch.cuda.is_initialized(),
    "status": spec.manifest.cache["status"],
    "gpu_capability": spec.manifest.cache_key["parts"]["ambient"]["gpu_capability"],
    "max_err": float((out - expected).abs().max()),
}))
"""


def _child(cache: Path) -> dict:
    env = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cold_and_warm_cpu_compiles_do_not_start_cuda(tmp_path: Path) -> None:
    cold, warm = _child(tmp_path), _child(tmp_path)
    assert (cold["status"], warm["status"]) == ("miss", "hit")
    for r in (cold, warm):
        assert r["cuda_initialized"] is False and r["gpu_capability"] is None
        assert r["max_err"] <= 1e-5

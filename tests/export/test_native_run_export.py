"""An export of a program whose runner runs its native calls as one C call
(:mod:`plait.runtime.native_run`) carries the launcher's library beside the kernels': loaded
by digest where nothing may be compiled, the program still runs them as one call, and matches
eager on fresh inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

import plait
from plait.codegen import native_launch

SRC = Path(plait.__file__).resolve().parents[1]
ROOT = SRC.parent

CHILD = """
import sys, torch, plait
from plait.runtime.native_run import NativeRun
from tests.export.test_native_run_export import model, check
loaded = plait.load(sys.argv[1], trust=sys.argv[2])
m = model()
gen = torch.Generator().manual_seed(31)
for _ in range(3):
    check(loaded, m, torch.randn(2, 8, 6, 6, generator=gen))
program = loaded.builds[-1].program
runs = [v for v in program.runner.globals.values() if isinstance(v, NativeRun)]
print("runs", len(runs), "bound", sum(r.key is not None for r in runs))
"""


def model() -> nn.Module:
    """1x1, depthwise, 1x1, 1x1: the depthwise call and the middle 1x1 one form a run."""
    torch.manual_seed(30)
    return nn.Sequential(
        nn.Conv2d(8, 16, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16),
        nn.Conv2d(16, 8, 1), nn.Conv2d(8, 4, 1),
    ).eval()  # fmt: skip


def check(compiled: object, m: nn.Module, x: torch.Tensor) -> None:
    from tests.util import contract_tol

    with torch.no_grad():
        got, want = compiled(x), m(x)  # type: ignore[operator]
    torch.testing.assert_close(got, want, **contract_tol("conv", torch.float32))


def test_an_export_carries_the_launcher_and_its_load_runs_the_calls_as_one(
    tmp_path: Path,
) -> None:
    x = torch.randn(2, 8, 6, 6, generator=torch.Generator().manual_seed(32))
    artifact = plait.export(model(), (x,))
    units = json.loads(artifact.members["native/index.json"])["units"]
    assert [native_launch.SYMBOL] in [u["symbols"] for u in units]
    path = artifact.save(tmp_path / "model.plait")
    env = {
        **os.environ,
        "PYTHONPATH": f"{SRC}{os.pathsep}{ROOT}",
        "PLAIT_CACHE_DIR": str(tmp_path / "fresh-cache"),
        "PLAIT_STAX_NO_COMPILE": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), artifact.digest],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["runs", "1", "bound", "1"], done.stdout

"""A cache hit answers like eager in the process that loads it: one process compiles and calls a
program (the cache filled), a second one, on the same cache after one change of what the compile
depended on, compiles and calls it again on fresh random inputs. Either the change misses the
entry, or the entry it loads still answers like eager in the second process; judged under the
numerical contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.util import contract_tol

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import contextlib, json, sys
import torch
from torch import nn
import plait

setup, cache, seed, mode, name = *sys.argv[1:3], int(sys.argv[3]), *sys.argv[4:6]
exec(setup)


class Tiny(nn.Module):
    # NOTE: s * s is a float32 denormal (9e-40): folded at compile time, as the model's constant
    def __init__(self):
        super().__init__()
        self.register_buffer("s", torch.full((8,), 3e-20))

    def forward(self, x):
        return ((x * 1e-5) / (self.s * self.s)) * 1e-34


class Head(nn.Module):
    # NOTE: a oneDNN linear (its weight prepacked) and a convolution with a batch norm folded in
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.bn(self.conv(x.view(4, 2, 1, 4).expand(4, 2, 3, 4).transpose(1, 2)))
        return self.lin(torch.relu(y).mean(dim=3).transpose(1, 2).reshape(4, 16)[:, :8])


model = {"tiny": Tiny, "head": Head}[name]().eval()
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
compiled = plait.compile(model, options={"cache": cache})
context = torch.inference_mode() if mode == "inference" else torch.no_grad()
with context:
    out = compiled(x)
    expected = model(x)
print(json.dumps({
    "status": compiled.specializations[-1].manifest.cache["status"],
    "out": out.double().tolist(),
    "expected": expected.double().tolist(),
}))
"""

FLUSH = "torch.set_flush_denormal(True)"


def _child(
    cache: Path, setup: str, seed: int, mode: str = "no_grad", model: str = "tiny"
) -> dict[str, Any]:
    environ = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    args = [sys.executable, "-c", CHILD, setup, str(cache / "artifacts"), str(seed), mode, model]
    proc = subprocess.run(args, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _like_eager(result: dict[str, Any], what: str) -> None:
    tol = contract_tol("model", torch.float32)
    torch.testing.assert_close(
        torch.tensor(result["out"]),
        torch.tensor(result["expected"]),
        rtol=tol["rtol"],
        atol=tol["atol"],
        msg=lambda m: f"{what} (cache {result['status']}): {m}",
    )


def _flushes_denormals() -> bool:
    torch.set_flush_denormal(True)
    try:
        return float(torch.tensor(1e-40)) == 0.0
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.skipif(not _flushes_denormals(), reason="this CPU cannot flush denormals")
@pytest.mark.parametrize("first", ["flushed", "kept"])
def test_denormals_flushed_at_compile_time_are_not_served_without(
    tmp_path: Path, first: str
) -> None:
    """A constant folded while denormals flushed to zero (``torch.set_flush_denormal(True)``)
    is 0 where eager, without it, divides by a denormal: the setting is a key part (and a
    guard), so the process that differs compiles its own."""
    setups = {"flushed": FLUSH, "kept": ""}
    second = "kept" if first == "flushed" else "flushed"
    cache = tmp_path / "cache"
    _like_eager(_child(cache, setups[first], seed=1), f"{first}, cold")
    result = _child(cache, setups[second], seed=2)
    _like_eager(result, f"{second} after {first}")
    assert result["status"] == "miss"


@pytest.mark.parametrize("first", ["no_grad", "inference"])
def test_a_warm_start_under_inference_mode_answers_like_eager(tmp_path: Path, first: str) -> None:
    """``torch.inference_mode()`` around the call: the entry's constants loaded (and folded, on
    a cold compile) under it would be inference tensors, which have no version counter for the
    prepacked weights' checks to read."""
    cache = tmp_path / "cache"
    _like_eager(_child(cache, "", seed=1, mode=first, model="head"), f"{first}, cold")
    result = _child(cache, "", seed=2, mode="inference", model="head")
    _like_eager(result, f"inference mode after {first}")
    assert result["status"] == "hit"

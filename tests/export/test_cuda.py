"""A program exported on CUDA (Stax's Triton kernels, PyTorch's CUDA externs) loads in a fresh
process that cannot import its code, runs on the GPU bit for bit as ``plait.compile`` runs it,
and verifies. Skipped without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import plait
from tests.export.models import TransformerBlock, seeded

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
pytest.importorskip("triton")

SRC = Path(plait.__file__).resolve().parents[1]
CHILD = """
import sys, torch, plait
from safetensors.torch import load_file, save_file
try:
    import tests
except ImportError:
    pass
else:
    raise SystemExit("tests is importable in the loading process")
loaded = plait.load(sys.argv[1])
x = load_file(sys.argv[2])["x"].cuda()
save_file({"y": loaded(x).cpu()}, sys.argv[3])
print(loaded.native["status"], loaded.builds[0].program.target)
"""


def test_a_cuda_export_round_trips_in_a_fresh_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TransformerBlock().eval().cuda()
    artifact = plait.export(model, (torch.randn(2, 16, 32, generator=seeded(31)).cuda(),))
    assert artifact.header["device"] == "cuda:0" and artifact.header["executor"] == "stax"
    assert not artifact.native  # NOTE: Triton kernels are never carried
    path = artifact.save(tmp_path / "block.plait")
    x = torch.randn(2, 16, 32, generator=seeded(32))
    with torch.no_grad():
        want = plait.compile(model)(x.cuda()).cpu()
    save_file({"x": x}, tmp_path / "x.safetensors")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(tmp_path / "x.safetensors"),
         str(tmp_path / "y.safetensors")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["none", "triton"]
    assert torch.equal(load_file(tmp_path / "y.safetensors")["y"], want)
    result = plait.verify(path)
    assert result.ok and result.bitwise_as_exported, str(result)

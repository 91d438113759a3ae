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
import triton
from triton import knobs

triton.runtime.driver.active.utils  # NOTE: Triton's own runtime module, built once per install
compiles = []


def no_compiler(*args, **kwargs):
    raise RuntimeError("a C compiler was run to build a launcher")


knobs.build.impl = no_compiler
knobs.compilation.listener = lambda **kw: compiles.append(kw["cache_hit"])
loaded = plait.load(sys.argv[1], trust=sys.argv[4] or None)
x = load_file(sys.argv[2])["x"].cuda()
save_file({"y": loaded(x).cpu()}, sys.argv[3])
pooled = (loaded.builds[0].program.triton_precompile or {}).get("pooled", 0)  # NOTE: this load's
print(loaded.native["status"], loaded.builds[0].program.target, len(compiles), sum(compiles),
      int(pooled))
"""


def _fresh_load(tmp_path: Path, path: Path, trust: str, cache: Path) -> list[str]:
    """The artifact loaded and called in a fresh process on an empty Triton cache that may not
    run a C compiler; prints the native status, the target, Triton compiles and cache hits in
    that process, and the kernels its compile workers compiled (they may run one)."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "TRITON_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(tmp_path / "x.safetensors"),
         str(tmp_path / "y.safetensors"), trust],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0 or trust == "", proc.stderr[-4000:]
    return proc.stdout.split() if proc.returncode == 0 else ["failed", proc.stderr[-400:]]


def test_a_cuda_export_round_trips_in_a_fresh_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TransformerBlock().eval().cuda()
    artifact = plait.export(model, (torch.randn(2, 16, 32, generator=seeded(31)).cuda(),))
    assert artifact.header["device"] == "cuda:0" and artifact.header["executor"] == "stax"
    assert artifact.native, artifact.header["native_note"]  # NOTE: compiled Triton kernels
    path = artifact.save(tmp_path / "block.plait")
    x = torch.randn(2, 16, 32, generator=seeded(32))
    with torch.no_grad():
        want = plait.compile(model)(x.cuda()).cpu()
    save_file({"x": x}, tmp_path / "x.safetensors")

    trusted = _fresh_load(tmp_path, path, artifact.digest, tmp_path / "trusted-cache")
    status, target, compiles, hits, pooled = trusted
    assert (status, target) == ("loaded", "triton") and int(compiles) > 0
    # NOTE: every kernel found carried: none compiled (here or by a worker), no launcher built
    assert hits == compiles and pooled == "0", trusted
    assert torch.equal(load_file(tmp_path / "y.safetensors")["y"], want)

    # NOTE: untrusted, the kernels compile again, by the compile workers (they build the
    # launchers): this process loads each one, building none
    untrusted = _fresh_load(tmp_path, path, "", tmp_path / "untrusted-cache")
    status, target, compiles, hits, pooled = untrusted
    assert status == "rebuilt" and int(pooled) >= 2 and hits == compiles, untrusted
    assert torch.equal(load_file(tmp_path / "y.safetensors")["y"], want)

    result = plait.verify(path)
    assert result.ok and result.bitwise_as_exported, str(result)

"""The cache keys name the plait code that made an entry, not only its version: another plait
source tree (an edited file, an upgrade that keeps the version string) neither loads an
artifact entry nor takes a snapshot the first one saved; it captures and compiles again, and
answers like eager. The digest of the code is remembered on disk for the files' stat
identities, and a file changed behind an unchanged size and mtime is still seen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import plait

PACKAGE = Path(plait.__file__).resolve().parent

MODEL = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x)) * 2.0 + x[:, :4]
"""

CHILD = r"""
import json, sys, warnings
import torch
import plait
from code_identity_model import Net

torch.manual_seed(0)
net = Net().eval()
options = {"warm_start": "fingerprint", "cache": sys.argv[1]}
compiled = plait.compile(net, backend="eager", options=options)
same = True
with torch.no_grad():
    for seed in range(3):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(4200 + seed))
        # NOTE: the interpreter keeps eager's arithmetic order: bitwise
        same = same and torch.equal(compiled(x), net(x))
cache = compiled.specializations[0].manifest.cache
print(json.dumps({"plait": plait.__file__, "status": cache["status"], "miss": cache.get("miss"),
                  "capture": cache.get("capture"), "events": cache["events"], "same": same}))
"""


def _copy_package(dest: Path) -> Path:
    target = dest / "plait"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _run(tree: Path, models: Path, cache: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), str(models)]),
        "PLAIT_CACHE_DIR": str(cache / "kernels"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", CHILD, str(cache / "artifacts")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["plait"].startswith(str(tree)), result  # NOTE: the copy ran, not this tree
    assert result["same"], result
    return result


@pytest.mark.slow
def test_edited_plait_code_misses_both_caches(tmp_path: Path) -> None:
    tree, models, cache = tmp_path / "tree", tmp_path / "models", tmp_path / "cache"
    models.mkdir()
    (models / "code_identity_model.py").write_text(textwrap.dedent(MODEL))
    copy = _copy_package(tree)
    first = _run(tree, models, cache)
    assert first["status"] == "miss" and str(first["capture"]).endswith("saved"), first
    again = _run(tree, models, cache)
    assert again["status"] == "hit" and str(again["capture"]).startswith("snapshot"), again
    # NOTE: any change to plait's code, same version string: here a line added to capture
    with (copy / "frontend" / "tracer.py").open("a") as f:
        f.write("\n# another plait\n")
    edited = _run(tree, models, cache)
    assert str(edited["capture"]).startswith("captured: no snapshot for this front key"), edited
    assert edited["status"] == "miss" and "plait_code" in str(edited["miss"]), edited
    assert edited["events"] == [], edited
    assert _run(tree, models, cache)["status"] == "hit"  # NOTE: the edited tree's own entry


def test_the_remembered_digest_follows_the_contents(tmp_path: Path) -> None:
    """The memo of the digest is keyed by stat fields; a file rewritten to the same size with
    its mtime put back, the package data (the contract) and a new module all change the
    digest, and it always equals the digest of the contents computed afresh."""
    from plait.cache import code_identity

    copy = _copy_package(tmp_path)
    digests = [code_identity.package_digest(copy)]
    assert digests[0] == code_identity.content_digest(copy)
    assert code_identity.package_digest(copy) == digests[0]  # NOTE: from the memo

    source = copy / "passes" / "fold.py"
    before = source.stat()
    text = source.read_text()
    source.write_text(
        text.replace("MAX_FOLDED_ELEMENTS = 1 << 16", "MAX_FOLDED_ELEMENTS = 1 << 17")
    )
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert source.stat().st_size == before.st_size
    assert source.stat().st_mtime_ns == before.st_mtime_ns
    digests.append(code_identity.package_digest(copy))

    contract = copy / "contract" / "default.toml"
    contract.write_text(contract.read_text() + "\n")
    digests.append(code_identity.package_digest(copy))
    (copy / "passes" / "extra.py").write_text("X = 1\n")
    digests.append(code_identity.package_digest(copy))
    (copy / "passes" / "__pycache__").mkdir(exist_ok=True)
    (copy / "passes" / "__pycache__" / "extra.cpython-311.pyc").write_bytes(b"bytecode")
    digests.append(code_identity.package_digest(copy))

    assert len(set(digests[:4])) == 4, digests  # NOTE: every change of a source seen
    assert digests[4] == digests[3]  # NOTE: bytecode is not the code's identity
    assert digests[-1] == code_identity.content_digest(copy)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * 2.0 + x[:, :4]


def _compile_run(net: torch.nn.Module, cache: Path) -> Any:
    """Compile, check bitwise against eager (the interpreter keeps its arithmetic order) on
    fresh inputs; the specialization's manifest."""
    compiled = plait.compile(
        net, backend="eager", options={"warm_start": "fingerprint", "cache": str(cache)}
    )
    with torch.no_grad():
        for seed in range(3):
            x = torch.randn(3, 6, generator=torch.Generator().manual_seed(4300 + seed))
            assert torch.equal(compiled(x), net(x))
    return compiled.specializations[0].manifest


def test_another_code_digest_is_another_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one process: the same program under another code digest misses the artifact entry
    (the miss names the part) and the snapshot."""
    from plait.cache import code_identity

    torch.manual_seed(3)
    net = _Net().eval()
    assert _compile_run(net, tmp_path).cache["status"] == "miss"
    warm = _compile_run(net, tmp_path)
    assert warm.cache["status"] == "hit" and str(warm.cache["capture"]).startswith("snapshot")
    monkeypatch.setattr(code_identity, "plait_code_digest", lambda: "0" * 64)
    other = _compile_run(net, tmp_path)
    assert str(other.cache["capture"]).startswith("captured: no snapshot"), other.cache
    assert other.cache["status"] == "miss" and "plait_code" in other.cache["miss"], other.cache
    assert other.cache_key["parts"]["toolchain"]["plait_code"] == "0" * 64


def test_code_that_cannot_be_identified_is_compiled_uncached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plait.cache import code_identity

    def unreadable() -> str:
        raise FileNotFoundError("a module removed while the package was walked")

    monkeypatch.setattr(code_identity, "plait_code_digest", unreadable)
    m = _compile_run(_Net().eval(), tmp_path)
    assert m.cache["status"] == "not cached", m.cache
    assert "plait's own code could not be identified" in m.cache["events"][0], m.cache
    assert "front key could not be made" in str(m.cache["capture"]), m.cache

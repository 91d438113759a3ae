"""The trust model of native kernels: a planted library (a constructor that leaves a file behind
when it is loaded, in place of a real kernel unit, declared consistently) is never loaded
without trust: the kernels are rebuilt from the IR and the load says why; a load that trusts the
original artifact's digest refuses the planted one; a trusted library built for another
toolchain is not loaded either. The positive control, in a process of its own: trusting the
planted artifact's digest does load it (so the sentinel is a real witness)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import plait
from plait.errors import ArtifactTrustError
from tests.export import crafting
from tests.export.models import MLP, seeded

SRC = Path(plait.__file__).resolve().parents[1]


def _library(path: Path, sentinel: Path, symbols: list[str]) -> bytes:
    kernels = "\n".join(f'extern "C" int {s}(void* args) {{ return 0; }}' for s in symbols)
    source = path.with_suffix(".cpp")
    source.write_text(
        "#include <fcntl.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        f'  int fd = open("{sentinel}", O_CREAT | O_WRONLY, 0600);\n'
        "  if (fd >= 0) close(fd);\n}\n" + kernels + "\n"
    )
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert cxx is not None
    subprocess.run([cxx, "-shared", "-fPIC", str(source), "-o", str(path)], check=True)
    return path.read_bytes()


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("planted")
    torch.manual_seed(0)
    model = MLP(16, 32, 8).eval()
    x = torch.randn(4, 16, generator=seeded(21))
    artifact = plait.export(model, (x,))
    members = crafting.members_of(artifact.save(root / "real.plait"))
    index = json.loads(members["native/index.json"])
    unit = index["units"][0]
    sentinel = root / "planted-library-ran"
    evil = _library(root / "planted.so", sentinel, unit["symbols"])
    unit["sha256"] = __import__("hashlib").sha256(evil).hexdigest()
    members[f"native/{unit['key']}.so"] = evil
    members["native/index.json"] = json.dumps(index).encode()
    members = crafting.reindexed(members)
    path = crafting.write(root / "planted.plait", members)
    return {
        "model": model,
        "path": path,
        "sentinel": sentinel,
        "real_digest": artifact.digest,
        "planted_digest": crafting.digest(members),
        "members": members,
        "root": root,
    }


def test_a_planted_library_is_not_loaded_without_trust(planted: dict[str, Any]) -> None:
    loaded = plait.load(planted["path"])
    x = torch.randn(4, 16, generator=seeded(22))
    with torch.no_grad():
        assert torch.equal(loaded(x), plait.compile(planted["model"])(x))
    assert not planted["sentinel"].exists()
    assert loaded.native["status"] == "rebuilt"
    report = str(plait.explain(loaded))
    assert "native kernels rebuilt" in report and "loaded only when its digest is trusted" in report


def test_trusting_the_original_digest_refuses_the_planted_artifact(planted: dict[str, Any]) -> None:
    with pytest.raises(ArtifactTrustError, match=planted["planted_digest"]):
        plait.load(planted["path"], trust=planted["real_digest"])
    assert not planted["sentinel"].exists()


def test_trusted_libraries_of_another_toolchain_are_rebuilt(planted: dict[str, Any]) -> None:
    members = dict(planted["members"])
    index = json.loads(members["native/index.json"])
    index["toolchain"]["cpu_flags"] = "an-older-cpu"
    members = crafting.reindexed({**members, "native/index.json": json.dumps(index).encode()})
    path = crafting.write(planted["root"] / "other-cpu.plait", members)
    loaded = plait.load(path, trust=crafting.digest(members))
    assert loaded.native["status"] == "rebuilt"
    assert "another toolchain or CPU (cpu_flags differ)" in loaded.native["reason"]
    assert not planted["sentinel"].exists()


CONTROL = """
import sys, plait
loaded = plait.load(sys.argv[1], trust=sys.argv[2])
print(loaded.native["status"])
"""


def test_trusting_the_planted_digest_loads_it(planted: dict[str, Any]) -> None:
    """The positive control: the sentinel does witness a loaded library."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CONTROL, str(planted["path"]), planted["planted_digest"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["loaded"]
    assert planted["sentinel"].exists()
    planted["sentinel"].unlink()

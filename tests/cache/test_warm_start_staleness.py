"""A warm start never serves a stale program: across processes, change exactly one thing a
model's ``forward`` depends on and the next process captures again and answers like eager.

One process compiles and calls a model (the cache filled: artifact and snapshot); a second one
on a copy of that cache, after one change, compiles and calls it again. The change is either in
the model's source files (rewritten between the processes) or made by the second process to the
model it built (``MUTATE``: hooks, a replaced buffer, a parameter's dtype, a monkeypatch). The
control case changes nothing and must warm-start from the snapshot, so a miss in the other cases
is the change's doing. Answers are judged against eager under the numerical contract."""

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

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from torch import nn
import torch.nn.functional as F
import plait
import plait.api  # NOTE: the whole compiler imported before the change, as in a user's program
import case_model
options = json.loads(sys.argv[3])
model = case_model.build()
exec(sys.argv[2], {"model": model, "torch": torch, "nn": nn, "F": F, "case_model": case_model})
args = case_model.inputs()
compiled = plait.compile(model, backend="eager", options={"cache": sys.argv[4], **options})
with torch.no_grad():
    out = compiled(*args)
    expected = model(*args)
spec = compiled.specializations[0]
print(json.dumps({
    "capture": spec.manifest.cache["capture"],
    "status": spec.manifest.cache["status"],
    "dtype": str(out.dtype),
    "out": out.double().flatten().tolist(),
    "expected": expected.double().flatten().tolist(),
}))
"""

MODEL = """
import dataclasses
import torch
import torch.nn.functional as F
from torch import nn
import case_helper

SCALE = 2.0


@dataclasses.dataclass
class Cfg:
    eps: float = 1e-5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfg = Cfg()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, 4))
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        y = self.act(self.lin(x)) + self.shift
        y = case_helper.mix(y) * SCALE * self.scale
        return F.silu(y) / (y.abs().mean() + self.cfg.eps)


def build():
    torch.manual_seed(0)
    return Net().eval()


def inputs():
    return (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)),)
"""

HELPER = """
def mix(y):
    return y.tanh() + y
"""

# NOTE: a closure a forward calls: its cell is not named where it is read
CLOSURE_MODEL = """
import torch
from torch import nn


def make(k):
    def scaled(y):
        return y * k

    return scaled


SCALED = make(2.0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return SCALED(self.lin(x)).relu()


def build():
    torch.manual_seed(0)
    return Net().eval()


def inputs():
    return (torch.randn(3, 4, generator=torch.Generator().manual_seed(1)),)
"""

BASE = {"case_model.py": MODEL, "case_helper.py": HELPER}

# name: (file edits {file: (old, new)}, code the second process runs on the model it built)
CASES: dict[str, tuple[dict[str, tuple[str, str]], str]] = {
    "own code": ({"case_model.py": ("+ self.shift", "- self.shift")}, ""),
    "called function's code": ({"case_helper.py": ("y.tanh()", "y.sigmoid()")}, ""),
    "global in the source": ({"case_model.py": ("SCALE = 2.0", "SCALE = 3.0")}, ""),
    "global set at run time": ({}, "case_model.SCALE = 3.0"),
    "config default": ({"case_model.py": ("eps: float = 1e-5", "eps: float = 0.5")}, ""),
    "config attribute": ({}, "model.cfg.eps = 0.5"),
    "config object swapped": ({}, "import types; model.cfg = types.SimpleNamespace(eps=0.5)"),
    "submodule swapped": ({}, "model.act = nn.GELU()"),
    "forward hook": ({}, "model.lin.register_forward_hook(lambda m, i, o: o * 2)"),
    "forward pre-hook": ({}, "model.lin.register_forward_pre_hook(lambda m, a: (a[0] * 2,))"),
    "root forward hook": ({}, "model.register_forward_hook(lambda m, i, o: o + 1)"),
    "buffer values": ({}, "model.shift = torch.linspace(2.0, 3.0, 4)"),
    "buffer shape": ({}, "model.shift = torch.tensor([5.0])"),
    "parameter dtype": ({}, "model.scale = nn.Parameter(model.scale.detach().double())"),
    "functional patched": ({}, "F.silu = torch.tanh"),
    "functional rebound in the model's module": (
        {},
        "import types; case_model.F = types.SimpleNamespace(silu=torch.tanh)",
    ),
    "tensor method patched": ({}, "torch.Tensor.tanh = torch.Tensor.sigmoid"),
}


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)


def _child(folder: Path, cache: Path, mutate: str = "", options: Any = None) -> dict[str, Any]:
    environ = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(folder),
            mutate,
            json.dumps(options or {}),
            str(cache / "artifacts"),
        ],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _close(result: dict[str, Any], what: str) -> None:
    """The compiled answer against eager's, within the contract's row for a model."""
    tol = plait.contract.load().tolerance("model", getattr(torch, result["dtype"][6:]))
    torch.testing.assert_close(
        torch.tensor(result["out"]),
        torch.tensor(result["expected"]),
        rtol=tol.rtol,
        atol=tol.atol,
        msg=lambda m: f"{what} ({result['capture']}): {m}",
    )


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model's files and a cache its first process filled."""
    root = tmp_path_factory.mktemp("warm_staleness")
    _write(root / "src", BASE)
    cold = _child(root / "src", root / "cache", options={"warm_start": "fingerprint"})
    assert cold["capture"].endswith("saved"), cold["capture"]
    _close(cold, "cold")
    return root


def _copy(filled: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(filled / "src", tmp_path / "src")
    shutil.copytree(filled / "cache", tmp_path / "cache")
    return tmp_path / "src", tmp_path / "cache"


@pytest.mark.slow
def test_nothing_changed_warm_starts_from_the_snapshot(filled: Path, tmp_path: Path) -> None:
    src, cache = _copy(filled, tmp_path)
    warm = _child(src, cache, options={"warm_start": "fingerprint"})
    assert warm["capture"].startswith("snapshot"), warm["capture"]
    assert warm["status"] == "hit"
    _close(warm, "unchanged")


@pytest.mark.slow
def test_the_default_warm_start_captures_and_loads_the_artifact(
    filled: Path, tmp_path: Path
) -> None:
    src, cache = _copy(filled, tmp_path)
    warm = _child(src, cache)
    assert warm["capture"] == "captured (the default warm start)", warm["capture"]
    assert warm["status"] == "hit"
    _close(warm, "unchanged")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("warm_start", ["default", "fingerprint"])
def test_one_change_captures_again(
    filled: Path, tmp_path: Path, name: str, warm_start: str
) -> None:
    edits, mutate = CASES[name]
    src, cache = _copy(filled, tmp_path)
    for file, (old, new) in edits.items():
        text = (src / file).read_text()
        assert old in text, (file, old)
        _write(src, {file: text.replace(old, new)})
    options = {} if warm_start == "default" else {"warm_start": "fingerprint"}
    warm = _child(src, cache, mutate, options)
    _close(warm, name)
    if name == "buffer values" and warm_start == "fingerprint":
        # NOTE: capture reads no buffer's values: the captured program still holds, and its
        # state is read at the call (or frozen under the weights' digest in the artifact key)
        assert warm["capture"].startswith("snapshot"), warm["capture"]
        return
    assert warm["capture"].startswith("captured"), f"{name}: {warm['capture']}"


@pytest.mark.slow
def test_a_closure_variable_changed(tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    _write(src, {"case_model.py": CLOSURE_MODEL})
    cold = _child(src, cache, options={"warm_start": "fingerprint"})
    _close(cold, "cold")
    _write(src, {"case_model.py": CLOSURE_MODEL.replace("make(2.0)", "make(3.0)")})
    warm = _child(src, cache, options={"warm_start": "fingerprint"})
    assert warm["capture"].startswith("captured"), warm["capture"]
    _close(warm, "closure")

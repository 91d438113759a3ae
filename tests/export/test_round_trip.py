"""Round trip: export here, load in a fresh process that cannot import the models' code, and
get the compiled program's outputs bit for bit on fresh random inputs.

Two loading processes: one builds the kernels from the IR (the artifacts are not trusted), the
other loads the artifacts' native kernels (their digests trusted) in a fresh kernel cache with
the C++ compiler forbidden (``PLAIT_STAX_NO_COMPILE=1``), and first shows that the untrusted
path would have needed it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import plait
from plait.errors import ExportWarning
from tests.export.models import cases, flat_tensors, fresh_call

SRC = Path(plait.__file__).resolve().parents[1]

CHILD = r"""
import json, sys, warnings
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file

for name in ("benchmarks", "tests"):
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} is importable in the loading process")

import plait
from plait.errors import ExportWarning

def flat(obj, name="out"):
    if isinstance(obj, dict):
        return {k2: v2 for k, v in obj.items() for k2, v2 in flat(v, f"{name}/{k}").items()}
    if isinstance(obj, (tuple, list)):
        return {k2: v2 for i, v in enumerate(obj) for k2, v2 in flat(v, f"{name}/{i}").items()}
    return {name: obj}

plan = json.loads(Path(sys.argv[1]).read_text())
status = {}
if plan["trusted"]:
    from plait.errors import PlaitCompileError
    try:
        plait.load(plan["models"]["mlp"]["artifact"])
    except PlaitCompileError as exc:
        status["untrusted_without_compiler"] = str(exc)
for name, entry in plan["models"].items():
    trust = entry["digest"] if plan["trusted"] else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportWarning)
        loaded = plait.load(entry["artifact"], trust=trust)
    tensors = load_file(entry["inputs"])
    args = [tensors[k] for k in entry["args"]]
    kwargs = {k: (tensors[v] if v in tensors else v) for k, v in entry["kwargs"].items()}
    result = flat(loaded(*args, **kwargs))
    save_file({k: v for k, v in result.items() if isinstance(v, torch.Tensor)}, entry["outputs"])
    status[name] = {
        "native": loaded.native["status"],
        "values": {k: v for k, v in result.items() if not isinstance(v, torch.Tensor)},
        "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("benchmarks", "tests")),
    }
Path(plan["status"]).write_text(json.dumps(status))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each program exported and saved, with fresh inputs and the compiled program's outputs."""
    root = tmp_path_factory.mktemp("round-trip")
    out: dict[str, Any] = {}
    for name, (fn, args, kwargs, options) in cases().items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ExportWarning)
            artifact = plait.export(fn, args, kwargs, **options)
        path = artifact.save(root / f"{name}.plait")
        compiled = plait.compile(fn, dynamic=options.get("dynamic"))
        call_args, call_kwargs = fresh_call(name, args, kwargs, seed=1234)
        with torch.no_grad():
            expected = flat_tensors(compiled(*call_args, **call_kwargs))
        tensors = {f"arg{i}": a for i, a in enumerate(call_args)}
        tensors.update(
            {f"kw_{k}": v for k, v in call_kwargs.items() if isinstance(v, torch.Tensor)}
        )
        save_file(tensors, root / f"{name}.inputs.safetensors")
        kwargs_plan = {
            k: (f"kw_{k}" if isinstance(v, torch.Tensor) else v) for k, v in call_kwargs.items()
        }
        out[name] = {
            "artifact": str(path),
            "digest": artifact.digest,
            "inputs": str(root / f"{name}.inputs.safetensors"),
            "args": [f"arg{i}" for i in range(len(call_args))],
            "kwargs": kwargs_plan,
            "expected": expected,
            "native": artifact.native,
            "executor": artifact.header["executor"],
        }
    return {"root": root, "models": out}


def _run_child(exported: dict[str, Any], trusted: bool, env: dict[str, str]) -> dict[str, Any]:
    root: Path = exported["root"]
    tag = "trusted" if trusted else "rebuilt"
    models = {
        name: {k: v for k, v in e.items() if k not in ("expected", "native", "executor")}
        | {"outputs": str(root / f"{name}.{tag}.safetensors")}
        for name, e in exported["models"].items()
    }
    plan = {"trusted": trusted, "models": models, "status": str(root / f"{tag}.json")}
    (root / f"{tag}.plan.json").write_text(json.dumps(plan))
    work = root / f"cwd-{tag}"
    work.mkdir()
    # NOTE: bitwise equality holds at the same thread count (parallel reductions split by it)
    threads = str(torch.get_num_threads())
    full_env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": threads, **env}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(root / f"{tag}.plan.json")],
        cwd=work,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((root / f"{tag}.json").read_text())


def _check_outputs(exported: dict[str, Any], status: dict[str, Any], tag: str) -> None:
    root: Path = exported["root"]
    for name, entry in exported["models"].items():
        got = load_file(root / f"{name}.{tag}.safetensors")
        expected = entry["expected"]
        tensors = {k: v for k, v in expected.items() if isinstance(v, torch.Tensor)}
        assert sorted(got) == sorted(tensors), name
        for key, want in tensors.items():
            assert got[key].dtype == want.dtype and torch.equal(got[key], want), f"{name} {key}"
        values = {k: v for k, v in expected.items() if not isinstance(v, torch.Tensor)}
        assert status[name]["values"] == values, name
        assert status[name]["modules"] == [], name


def test_round_trip_rebuilds_kernels_from_the_ir(exported: dict[str, Any]) -> None:
    status = _run_child(exported, trusted=False, env={})
    _check_outputs(exported, status, "rebuilt")
    for name, entry in exported["models"].items():
        assert status[name]["native"] == ("rebuilt" if entry["native"] else "none"), name


def test_round_trip_loads_trusted_native_kernels_without_a_compiler(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    env = {"PLAIT_CACHE_DIR": str(tmp_path / "fresh-cache"), "PLAIT_STAX_NO_COMPILE": "1"}
    status = _run_child(exported, trusted=True, env=env)
    _check_outputs(exported, status, "trusted")
    # NOTE: the same load without trust needs the compiler this process forbids
    assert "PLAIT_STAX_NO_COMPILE" in status["untrusted_without_compiler"]
    for name, entry in exported["models"].items():
        assert status[name]["native"] == ("loaded" if entry["native"] else "none"), name
        # NOTE: every Stax C++ program carries its kernels (symbolic shapes too)
        assert entry["native"] == (entry["executor"] == "stax"), name

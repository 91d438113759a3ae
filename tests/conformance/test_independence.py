"""The gate is independent of the compiler: plait.conformance imports only the standard library,
torch, numpy and plait.contract (import-linter enforces the same in CI)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

GATE = Path(__file__).resolve().parents[2] / "src" / "plait" / "conformance"
ALLOWED_ROOTS = {"torch", "numpy"} | set(sys.stdlib_module_names)
ALLOWED_PLAIT = ("plait.contract", "plait.conformance")


def foreign_imports(source: str, filename: str) -> list[str]:
    """Imports in ``source`` that the gate may not have."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.append(f"{filename}:{node.lineno}: relative import (name the module)")
                continue
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            root = module.split(".")[0]
            if root == "plait":
                ok = any(module == p or module.startswith(p + ".") for p in ALLOWED_PLAIT)
            else:
                ok = root in ALLOWED_ROOTS
            if not ok:
                found.append(f"{filename}:{node.lineno}: imports {module}")
    return found


def test_gate_modules_import_only_torch_stdlib_and_the_contract() -> None:
    files = sorted(GATE.rglob("*.py"))
    assert files, "no gate modules found"
    found = [
        hit
        for path in files
        for hit in foreign_imports(path.read_text(encoding="utf-8"), path.name)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import plait.ir",
        "from plait.passes import manager",
        "from plait import api",
        "import sympy",
        "from . import gate",
    ],
)
def test_the_check_itself_rejects_compiler_imports(source: str) -> None:
    assert foreign_imports(source, "x.py")


def test_the_check_accepts_what_the_gate_may_use() -> None:
    source = (
        "import torch\nimport math\nfrom plait.contract import load\nimport plait.conformance.tree"
    )
    assert foreign_imports(source, "x.py") == []


def test_importing_the_gate_loads_nothing_of_the_compiler() -> None:
    src = str(GATE.parents[1])
    code = (
        "import sys, plait.conformance\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('plait')))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    loaded = [m for m in out if m != "plait" and not m.startswith(ALLOWED_PLAIT)]
    assert not loaded, f"importing plait.conformance loaded: {loaded}"

"""Nothing in the compiler may lower or override a contract value.

The contract is read-only data: compiler modules (everything under ``src/plait`` but the contract
and the gate) may call ``plait.contract.load()`` and read what it returns; they may not build
contract objects, parse their own contract text, or load one from another path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "plait"
# NOTE: export reads back the contract an artifact was judged under (plait verify judges by it);
# it parses a stored contract, never lowers the one in force
OWNERS = ("contract", "conformance", "export")
FORBIDDEN_CALLS = {"Tolerance", "Contract", "GradcheckSpec", "ChangelogEntry", "from_data", "parse"}


def violations(source: str, filename: str) -> list[str]:
    """Ways ``source`` could lower or override the contract."""
    tree = ast.parse(source, filename)
    names: set[str] = set()  # names imported from plait.contract
    modules: set[str] = set()  # how plait.contract itself is spelled here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("plait.contract"):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("plait.contract"):
                    modules.add(alias.asname or alias.name)
    if not names and not modules:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, where = node.func, f"{filename}:{node.lineno}"
        if isinstance(func, ast.Name) and func.id in names:
            name = func.id
        elif isinstance(func, ast.Attribute) and ast.unparse(func.value) in modules:
            name = func.attr
        else:
            name = ""
        if name in FORBIDDEN_CALLS:
            found.append(f"{where}: builds or parses a contract ({name})")
        if name == "load" and (node.args or node.keywords):
            found.append(f"{where}: loads a contract other than the shipped one")
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in ("replace", "__setattr__", "setattr") and node.args:
            first = ast.unparse(node.args[0]).lower()
            if "contract" in first or "tol" in first:
                found.append(f"{where}: rewrites a contract value ({ast.unparse(node)})")
    return found


def test_compiler_modules_never_lower_a_contract_value() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in OWNERS:
            continue
        found += violations(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "from plait.contract import Tolerance\nt = Tolerance(1.0, 1.0, 'float32', True)",
        "import plait.contract\nc = plait.contract.load('loose.toml')",
        "import plait.contract as pc\nc = pc.from_data({})",
        "import dataclasses\nfrom plait.contract import load\nc = dataclasses.replace(load())\n"
        "d = dataclasses.replace(contract, version='x')",
    ],
)
def test_the_check_itself_sees_each_kind_of_override(source: str) -> None:
    assert violations(source, "compiler.py")


def test_reading_the_contract_is_allowed() -> None:
    source = "import plait.contract\ntol = plait.contract.load().tolerance('matmul', 'float32')"
    assert violations(source, "compiler.py") == []
    # NOTE: the compiler's own parse() (IR text) is not the contract's.
    source = "from plait.contract import load\nfrom plait.ir.text import parse\ng = parse('x')"
    assert violations(source, "compiler.py") == []

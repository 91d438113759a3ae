"""The suite takes its tolerances from the numerical contract: ``tools/check_test_tolerances.py``
(run by ``make lint``) finds none written as numbers outside tests/contract, and does find one
planted anywhere else, in a keyword, an assignment, a mapping or a child process's source."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_test_tolerances", ROOT / "tools" / "check_test_tolerances.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_has_no_tolerance_literals() -> None:
    assert _tool().literals(ROOT / "tests") == []


@pytest.mark.parametrize(
    "line",
    [
        "torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)",
        "torch.testing.assert_close(a, b, atol=0, rtol=0)",
        "ok = torch.allclose(a, b, atol = .5)",
        "atol = 1e-3",
        'TOL = {"rtol": 2e-2}',
        'CHILD = """\\nok = torch.allclose(y, m(x), rtol=1e-4, atol=1e-4)\\n"""',
    ],
)
def test_a_planted_literal_is_found(tmp_path: Path, line: str) -> None:
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "test_x.py").write_text(f"{line}\n")
    (tmp_path / "contract").mkdir()  # NOTE: the contract's own tests may write numbers
    (tmp_path / "contract" / "test_y.py").write_text(f"{line}\n")
    found = _tool().literals(tmp_path)
    assert [row.split(":")[:2] for row in found] == [[str(tmp_path / "cases" / "test_x.py"), "1"]]
    assert _tool().main(["check", str(tmp_path)]) == 1


@pytest.mark.parametrize(
    "line",
    [
        "torch.testing.assert_close(a, b, **contract_tol('model', torch.float32))",
        "torch.allclose(a, b, rtol=tol.rtol, atol=tol.atol)",
        "torch.isclose(x.log(), x, 0.25, atol=math.inf)",  # NOTE: a captured call's argument
    ],
)
def test_tolerances_from_the_contract_pass(tmp_path: Path, line: str) -> None:
    (tmp_path / "test_x.py").write_text(f"{line}\n")
    assert _tool().literals(tmp_path) == []

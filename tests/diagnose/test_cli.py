"""``plait diagnose`` and ``plait fuzz`` as standalone click commands (CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plait.diagnose.cli import diagnose_command, fuzz_command
from tests.diagnose.seeded import USER_PASS

REPROS = Path(__file__).parent / "repros"


def test_diagnose_reruns_a_repro_directory() -> None:
    result = CliRunner().invoke(diagnose_command, [str(REPROS / "fallback-view-output")])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("not reproduced")


def test_diagnose_bisects_a_program_and_writes_its_repro(tmp_path: Path) -> None:
    target = "tests.diagnose.targets:sigmoid_mlp"
    ok = CliRunner().invoke(diagnose_command, [target])
    assert ok.exit_code == 0, ok.output
    assert "passes the conformance gate" in ok.output
    bad = CliRunner().invoke(
        diagnose_command,
        [target, "--passes", f"inference,{USER_PASS}", "--repro-dir", str(tmp_path / "r")],
    )
    assert bad.exit_code == 1, bad.output
    assert f"pass {USER_PASS!r}" in bad.output and "fast-sigmoid.tanh-form" in bad.output
    again = CliRunner().invoke(diagnose_command, [str(tmp_path / "r")])
    assert again.exit_code == 1 and again.output.startswith("reproduced"), again.output


def test_diagnose_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    result = CliRunner().invoke(diagnose_command, [str(tmp_path)])
    assert result.exit_code != 0 and "not a repro directory" in result.output
    result = CliRunner().invoke(diagnose_command, ["no-colon"])
    assert result.exit_code != 0


def test_fuzz_prints_a_json_summary() -> None:
    args = ["-n", "3", "--seed", "1", "--json", "--progress", "quiet"]
    result = CliRunner().invoke(fuzz_command, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["graphs"] == 3 and summary["divergences"] == []

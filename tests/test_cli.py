"""The ``plait`` command line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from plait.cli import main
from plait.manifest import Manifest


def test_explain_prints_a_saved_manifest(tmp_path: Path) -> None:
    m = Manifest(source_hash="c" * 64, options={"backend": "eager"})
    m.passes.append(
        {
            "name": "cse",
            "changed": True,
            "details": {},
            "rewrites": [{"rule": "cse.duplicate", "replaced": [3], "produced": []}],
        }
    )
    m.fallbacks.append({"what": "node 4 (opaque torch.nonzero)", "reason": "no IR op"})
    path = tmp_path / "manifest.json"
    m.save(path)
    result = CliRunner().invoke(main, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    assert "cse.duplicate×1" in result.output and "torch.nonzero" in result.output
    as_json = CliRunner().invoke(main, ["explain", "--json", str(path)])
    assert json.loads(as_json.output)["source_hash"] == "c" * 64


def test_explain_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"schema": "something-else"}')
    result = CliRunner().invoke(main, ["explain", str(path)])
    assert result.exit_code != 0 and "not a plait manifest" in result.output


def test_help_on_every_command() -> None:
    for args in (["--help"], ["explain", "--help"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0 and "Usage" in result.output

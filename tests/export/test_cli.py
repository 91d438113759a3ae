"""``plait verify ARTIFACT``: the verdict as the exit status (0 conforms, 1 does not, 3 the
artifact is refused), the report or its JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from plait.cli import VERIFY_CONFORMS, VERIFY_FAILS, VERIFY_REFUSED, main
from tests.export import crafting

GOLDEN = Path(__file__).parent / "golden" / "mlp-v1.plait"


def test_a_conforming_artifact_exits_0() -> None:
    result = CliRunner().invoke(main, ["verify", str(GOLDEN)])
    assert result.exit_code == VERIFY_CONFORMS, result.output
    assert "conforms" in result.output and "same bits as at export" in result.output
    as_json = CliRunner().invoke(main, ["verify", "--json", str(GOLDEN)])
    doc = json.loads(as_json.output)
    assert doc["ok"] is True and doc["format_version"] == 1


def test_an_artifact_whose_references_disagree_exits_1(tmp_path: Path) -> None:
    members = crafting.members_of(GOLDEN)
    tensors = dict(load_tensors(members["reference.safetensors"]))
    for name in ("case0/eager/0", "case0/float64/0"):
        tensors[name] = tensors[name] + 1.0  # NOTE: both references say another output
    members["reference.safetensors"] = save_tensors(tensors)
    path = crafting.write(tmp_path / "wrong.plait", crafting.reindexed(members))
    result = CliRunner().invoke(main, ["verify", str(path)])
    assert result.exit_code == VERIFY_FAILS, result.output
    assert "DOES NOT CONFORM" in result.output


def test_a_refused_artifact_exits_3(tmp_path: Path) -> None:
    bad = tmp_path / "bad.plait"
    bad.write_bytes(GOLDEN.read_bytes()[:200])
    result = CliRunner().invoke(main, ["verify", str(bad)])
    assert result.exit_code == VERIFY_REFUSED
    assert "refused: " in result.output and "truncated" in result.output
    other = CliRunner().invoke(main, ["verify", "--trust", "sha256:" + "0" * 64, str(GOLDEN)])
    assert other.exit_code == VERIFY_REFUSED and "the load trusts" in other.output

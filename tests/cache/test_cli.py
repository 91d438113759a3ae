"""``plait cache stats|verify|clear|explain-miss``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

from plait.cli import main
from tests.cache.helpers import convnet, run, sample


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["cache", *args])
    return result.exit_code, result.output


def test_help_lists_the_commands() -> None:
    code, out = _cli("--help")
    assert code == 0
    for name in ("stats", "verify", "clear", "explain-miss"):
        assert name in out


def test_stats_verify_clear(tmp_path: Path) -> None:
    run(convnet(), sample(), tmp_path / "artifacts")
    code, out = _cli("stats", "--dir", str(tmp_path))
    assert code == 0 and "3 entries" in out and "kernels:" in out
    assert "1 compiled artifacts, 1 captured programs, 1 records" in out
    code, out = _cli("stats", "--dir", str(tmp_path), "--json")
    assert json.loads(out)["entries"] == 3
    assert _cli("verify", "--dir", str(tmp_path)) == (0, "checked 3 entries: ok\n")
    for entry in (tmp_path / "artifacts" / "objects").glob("*/*"):
        entry.write_bytes(entry.read_bytes()[:-1])
    code, out = _cli("verify", "--dir", str(tmp_path))
    assert code == 1 and out.count("truncated") == 3
    run(convnet(), sample(), tmp_path / "artifacts")
    code, out = _cli("clear", "--dir", str(tmp_path), "--kernels")
    assert code == 0 and "removed 3 entries" in out
    assert "0 entries" in _cli("stats", "--dir", str(tmp_path))[1]


def test_dir_naming_the_store_itself(tmp_path: Path) -> None:
    """``--dir`` takes the directory ``options={"cache": DIR}`` named as the store itself."""
    store = tmp_path / "store"
    run(convnet(), sample(), store)
    code, out = _cli("stats", "--dir", str(store))
    assert code == 0 and "3 entries" in out
    assert _cli("verify", "--dir", str(store)) == (0, "checked 3 entries: ok\n")
    code, out = _cli("clear", "--dir", str(store))
    assert code == 0 and "removed 3 entries" in out
    assert "0 entries" in _cli("stats", "--dir", str(store))[1]


def test_dir_holding_no_cache_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a cache")
    for command in ("stats", "verify", "clear"):
        code, out = _cli(command, "--dir", str(tmp_path))
        assert code == 1 and "holds no plait cache" in out, (command, out)
    assert (tmp_path / "notes.txt").exists() and not (tmp_path / "artifacts").exists()


def test_explain_miss_names_the_part_that_differs(tmp_path: Path) -> None:
    _, spec = run(convnet(), sample(), tmp_path / "artifacts")
    manifest = tmp_path / "m.json"
    spec.manifest.save(manifest)
    code, out = _cli("explain-miss", str(manifest), "--dir", str(tmp_path))
    assert code == 0 and out.startswith("hit")
    model = convnet()
    with torch.no_grad():
        model.conv.weight.mul_(3)
    _, other = run(model, sample(), tmp_path / "elsewhere")
    other.manifest.save(manifest)
    code, out = _cli("explain-miss", str(manifest), "--dir", str(tmp_path))
    assert code == 0 and "miss" in out and "weights: was" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    code, out = _cli("explain-miss", str(bad), "--dir", str(tmp_path))
    assert code != 0 and "no cache key" in out

"""``plait explain`` and ``plait cache explain-miss`` on files that are not what they claim:
a FIFO (never read, never waited on), malformed or hostile JSON (one line, exit status 1, no
traceback), and control characters (printed escaped, never sent to the terminal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from plait.cli import main
from plait.manifest import SCHEMA, Manifest

COMMANDS = [["explain"], ["cache", "explain-miss"]]
ROOT = Path(__file__).parents[1]


def _run(args: list[str], path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args, str(path)])
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), f"{type(result.exception).__name__}: {result.exception}"
    return result.exit_code, result.output


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path, args: list[str]) -> None:
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "plait.cli", *args, str(fifo)],
        capture_output=True,
        text=True,
        timeout=120,  # NOTE: a reader that opens a FIFO without a writer waits forever
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    assert "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


MALFORMED = {
    "a list": b"[1, 2]",
    "deeply nested": b"[" * 200_000 + b"]" * 200_000,
    "not UTF-8": b'{"schema": "\xff\xfe"}',
    "a field of the wrong type": json.dumps({"schema": SCHEMA, "source_hash": 3}).encode(),
    "an unknown field": json.dumps({"schema": SCHEMA, "source_hash": "a", "x": 1}).encode(),
    "passes that are not objects": json.dumps(
        {"schema": SCHEMA, "source_hash": "a", "passes": [1, "two"]}
    ).encode(),
    "a cache key that is not an object": json.dumps(
        {"schema": SCHEMA, "source_hash": "a", "cache_key": [1]}
    ).encode(),
}


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("content", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_manifest_is_one_clear_line_and_exit_status_1(
    tmp_path: Path, args: list[str], content: bytes
) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(content)
    code, out = _run(args, path)
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 1, out
    assert lines[0].startswith(f"Error: {path}: "), out


def test_control_characters_in_a_manifest_are_printed_escaped(tmp_path: Path) -> None:
    hostile = "\x1b[2J\x1b]0;owned\x07\r\u202e"
    m = Manifest(source_hash="a" * 64 + hostile, guards=[f"x{hostile}"])
    m.fallbacks.append({"what": hostile, "reason": hostile})
    m.cache = {"status": "miss", "events": [hostile]}
    path = tmp_path / "manifest.json"
    m.save(path)
    code, out = _run(["explain"], path)
    assert code == 0, out
    assert not any(ch in out for ch in "\x1b\x07\r\u202e"), repr(out)
    assert out.count("\\x1b[2J") == 4  # NOTE: each one shown (what, reason, guard, event)
    json_code, json_out = _run(["explain", "--json"], path)
    assert json_code == 0 and "\x1b" not in json_out
    bad_name = tmp_path / "m\x1b[31m.json"
    bad_name.write_text("[]")
    code, out = _run(["explain"], bad_name)
    assert code == 1 and "\x1b" not in out and "m\\x1b[31m.json" in out


def test_cache_commands_on_a_directory_others_can_write_are_one_line(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "artifacts").mkdir(parents=True)
    os.chmod(shared / "artifacts", 0o777)
    for command in ("stats", "verify", "clear"):
        result = CliRunner().invoke(main, ["cache", command, "--dir", str(shared)])
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: plait refuses the directory"), result.output
        assert "writable by others" in result.output and "chmod go-w" in result.output

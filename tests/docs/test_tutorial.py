"""docs/tutorial.md: every Python block runs as written, in order, in one namespace (as a reader
pasting them into one session would), in a fresh directory, and what it prints says what the
tutorial says it prints."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

from plait import logs

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def test_the_tutorial_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(TUTORIAL.read_text())
    assert len(blocks) >= 6
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "tutorial"}
    printed = io.StringIO()
    try:
        for i, block in enumerate(blocks):
            code = compile(block, f"docs/tutorial.md, python block {i + 1}", "exec")
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                exec(code, namespace)
    finally:  # NOTE: the tutorial turns log channels on and off; leave them as they were
        logs.configure(os.environ.get(logs.ENVIRONMENT, ""))
    out = printed.getvalue()
    assert out.splitlines()[0] == "True"  # the compiled model agrees with eager
    assert "conformance PASSED" in out
    assert (tmp_path / "smallnet.html").is_file()
    assert "torch.is_grad_enabled() == False: expected False, got True" in out
    assert "reached the recompile limit" in out


def test_the_blocks_are_found() -> None:
    text = "x\n```python\na = 1\n```\n```sh\nls\n```\n```python\nb = 2\n```\n"
    assert python_blocks(text) == ["a = 1\n", "b = 2\n"]

"""The disk memo of slow probes (plait.codegen.build.remembered) and the compiler probe it
serves: a warm process runs no subprocess to learn the toolchain, and a memo for another
compiler binary, or an unreadable one, is never believed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from plait.codegen import build


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    build.toolchain.cache_clear()
    yield tmp_path
    build.toolchain.cache_clear()


def test_remembered_computes_once_per_identity(cache: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, object]:
        calls.append(1)
        return {"n": len(calls)}

    assert build.remembered("probe", ["a", 1], compute) == {"n": 1}
    assert build.remembered("probe", ["a", 1], compute) == {"n": 1}
    assert len(calls) == 1
    assert build.remembered("probe", ["a", 2], compute) == {"n": 2}  # NOTE: another identity
    (cache / "probe.json").write_text("{garbage")
    assert build.remembered("probe", ["a", 2], compute) == {"n": 3}
    (cache / "probe.json").write_text(json.dumps({"identity": ["a", 2], "value": [1]}))
    assert build.remembered("probe", ["a", 2], compute) == {"n": 4}  # NOTE: not an object


def test_toolchain_probe_runs_no_subprocess_once_remembered(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build.toolchain()
    build.toolchain.cache_clear()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a subprocess ran: {args}")

    with monkeypatch.context() as m:
        m.setattr(subprocess, "run", refuse)
        again = build.toolchain()
    assert again == first
    out = subprocess.run([first.cxx, "--version"], capture_output=True, text=True, check=False)
    assert again.version == out.stdout.splitlines()[0]


def test_toolchain_memo_of_another_compiler_is_probed_again(cache: Path) -> None:
    truth = build.toolchain()
    build.toolchain.cache_clear()
    memo = cache / "toolchain.json"
    saved = json.loads(memo.read_text())
    saved["identity"][0][2] = -1  # NOTE: the compiler binary's mtime, as another install's
    saved["value"]["version"] = "not this compiler"
    memo.write_text(json.dumps(saved))
    assert build.toolchain().version == truth.version

"""A Stax runner's Python code is compiled once per kernel cache (``runner_code``): a rebuild of
the same program loads it, checked against its SHA-256; a damaged blob is compiled again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from plait.codegen import build
from plait.ir import GraphBuilder, TensorType
from plait.runtime import compile_graph
from plait.runtime import runner as runner_mod


def _graph(width: int) -> Any:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, width), torch.float32))
    gb.output(gb.call("tanh", gb.call("mul", gb.call("relu", x), 3.0)))
    return gb.build()


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def spy(source: str, filename: str, mode: str) -> Any:
        seen.append(filename)
        return compile(source, filename, mode)

    monkeypatch.setattr(runner_mod, "compile", spy, raising=False)
    return seen


def _blobs() -> list[Path]:
    return sorted((build.cache_dir() / "runners").glob("*"))


def test_a_rebuilt_runner_is_loaded_not_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    seen = _compiles(monkeypatch)
    first = compile_graph(_graph(6))
    assert seen == [runner_mod.RUNNER_FILENAME]
    assert len([p for p in _blobs() if not p.name.endswith(".sha256")]) == 1
    again = compile_graph(_graph(6))
    assert seen == [runner_mod.RUNNER_FILENAME]  # NOTE: loaded from the cache this time
    assert again.source == first.source
    for seed in (1, 2):
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
        (want,) = first(x)
        (got,) = again(x)
        torch.testing.assert_close(got, torch.tanh(torch.relu(x) * 3.0))
        assert torch.equal(got, want)
    compile_graph(_graph(7))  # NOTE: another source, another blob
    assert len(seen) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage with its own hash"])
def test_a_damaged_runner_blob_is_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    compile_graph(_graph(5))
    (blob,) = [p for p in _blobs() if not p.name.endswith(".sha256")]
    data = bytearray(blob.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
        blob.write_bytes(bytes(data))
    elif damage == "truncate":
        blob.write_bytes(bytes(data[: len(data) // 3]))
    else:  # NOTE: consistent with its hash, but not code: refused when unmarshalled
        build._publish(b"\x00not marshal data", blob, blob.name)
    seen = _compiles(monkeypatch)
    if damage == "garbage with its own hash":  # NOTE: refused by marshal, not by its sidecar
        program = compile_graph(_graph(5))
    else:
        with pytest.warns(build.KernelCacheWarning, match="does not match its recorded hash"):
            program = compile_graph(_graph(5))
    assert seen == [runner_mod.RUNNER_FILENAME]
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(9))
    (got,) = program(x)
    torch.testing.assert_close(got, torch.tanh(torch.relu(x) * 3.0))
    compile_graph(_graph(5))  # NOTE: the blob was replaced: loaded now
    assert seen == [runner_mod.RUNNER_FILENAME]

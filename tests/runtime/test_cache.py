"""The kernel cache: reused by a new process without any compiler invocation, keyed by
everything that decides the machine code, published atomically, self-healing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plait.codegen.build import STATS, Unit, build_units, toolchain, unit_key

SCRIPT = textwrap.dedent(
    """
    import json, torch
    from plait.codegen.build import STATS
    from plait.ir import GraphBuilder, TensorType
    from plait.runtime import compile_graph
    gb = GraphBuilder()
    x = gb.input("x", TensorType((37, 5), torch.float32))
    h = gb.call("layer_norm", gb.call("gelu", x), None, None, normalized_shape=(5,))
    gb.output(h, gb.call("sum", gb.call("exp", x), dims=(0,)))
    program = compile_graph(gb.build())
    out = program(torch.ones(37, 5))
    print(json.dumps({"stats": STATS, "hits": [k.cache_hit for k in program.kernels],
                      "sum": float(out[1].sum())}))
    """
)


def _run(cache: Path, **env: str) -> dict:
    import json

    full = {**os.environ, "PLAIT_CACHE_DIR": str(cache), **env}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=full, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_new_process_reuses_kernels_without_compiling(tmp_path: Path) -> None:
    first = _run(tmp_path)
    assert first["stats"]["compiles"] >= 1 and not any(first["hits"])
    # NOTE: with PLAIT_STAX_NO_COMPILE=1 any compiler invocation raises: the run must not need one.
    second = _run(tmp_path, PLAIT_STAX_NO_COMPILE="1")
    assert second["stats"]["compiles"] == 0 and all(second["hits"])
    assert second["sum"] == first["sum"]


def test_cold_cache_refuses_to_compile_when_told(tmp_path: Path) -> None:
    full = {**os.environ, "PLAIT_CACHE_DIR": str(tmp_path), "PLAIT_STAX_NO_COMPILE": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=full, check=False)  # fmt: skip
    assert proc.returncode != 0 and "PLAIT_STAX_NO_COMPILE" in proc.stderr


def test_key_names_compiler_flags_and_cpu() -> None:
    tc = toolchain()
    base = unit_key("int x;", tc)
    assert unit_key("int y;", tc) != base
    for change in ({"flags": (*tc.flags, "-O2")}, {"cpu_flags": "sse2"}, {"version": "gcc 99"},
                   {"cxx": "/opt/other/g++"}):  # fmt: skip
        assert unit_key("int x;", dataclasses.replace(tc, **change)) != base
    assert str(Path.home()) not in base


def test_corrupt_entry_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    src = 'extern "C" int stax_test_corrupt(void* const* a) { return 7; }'
    unit = Unit(["stax_test_corrupt"], [src])
    build_units([unit])
    assert unit.path is not None and unit.path.exists()
    # NOTE: a new file (new inode): rewriting the loaded library in place would crash us.
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a shared library")
    os.replace(junk, unit.path)
    from plait.codegen import build

    build._LOADED.pop(unit.key)
    again = Unit(["stax_test_corrupt"], [src])
    before = STATS["compiles"]
    with pytest.warns(build.KernelCacheWarning, match="does not match its recorded hash"):
        build_units([again])
    assert STATS["compiles"] == before + 1 and not again.cache_hit
    assert again.lib is not None and again.lib.stax_test_corrupt(None) == 7

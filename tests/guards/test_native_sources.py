"""The C and C++ that plait ships as package data (``csrc/`` of plait.guards and plait.codegen):
each file compiles with ``-Wall -Werror`` under the flags and include paths its build uses, the
package data globs ship it, PyTorch's object layout that the guard evaluator assumes
(``torch_layout.h``) matches the running torch, and every compiled-object cache keys on the
files' text."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

import plait
from plait.codegen import (
    build,
    depthwise_conv,
    gemm_conv,
    global_pool,
    native_entries,
    native_hash,
    native_launch,
    pointwise_native,
    prelude,
    stem_conv,
)
from plait.guards import native

ROOT = Path(plait.__file__).parent
WARNINGS = ("-Wall", "-Werror", "-fsyntax-only")


def _shipped() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for pattern in ("*/csrc/*.cpp", "*/csrc/*.h", "*/csrc/*.c")
        for p in ROOT.glob(pattern)
    }


def _evaluator(tmp: Path, name: str) -> list[str]:
    tc = build.toolchain()
    flags = [f for f in native.FLAGS if f not in ("-w", "-shared")]
    return [tc.cxx, *flags, *WARNINGS, *native.include_flags(), str(ROOT / "guards/csrc" / name)]


def _prelude(tmp: Path) -> list[str]:
    # NOTE: as the kernels' translation units start (build.Unit.text), with their flags
    src = tmp / "prelude.cpp"
    src.write_text(prelude.PRELUDE)
    tc = build.toolchain()
    return [tc.cxx, *(f for f in tc.flags if f != "-shared"), *WARNINGS, str(src)]


def _hash(tmp: Path) -> list[str]:
    # NOTE: as build.installed_library wraps it
    src = tmp / "native_hash.cpp"
    src.write_text(f'extern "C" {{\n{native_hash.source()}\n}}\n')
    return [build.toolchain().cxx, *native_hash.FLAGS, *WARNINGS, str(src)]


def _depthwise(tmp: Path) -> list[str]:
    # NOTE: as depthwise_conv.kernel's units start, with every instantiation
    entries = "".join(
        depthwise_conv.entry(k, s, i, o)
        for k in depthwise_conv.KERNELS
        for s in depthwise_conv.STRIDES
        for i in (0, 1)
        for o in (0, 1, 2)
    )
    src = tmp / "depthwise.cpp"
    src.write_text(prelude.PRELUDE + "\n" + depthwise_conv.source() + "\n" + entries)
    tc = build.toolchain()
    return [tc.cxx, *(f for f in tc.flags if f != "-shared"), *WARNINGS, str(src)]


def _unit(tmp: Path, name: str, source: str, symbols: list[str], call: str) -> list[str]:
    # NOTE: as a native convolution's unit starts: the prelude, the kernel, every entry
    entries = "".join(native_entries.entry_text(sym, call.format(*args)) for sym, args in symbols)
    src = tmp / f"{name}.cpp"
    src.write_text(prelude.PRELUDE + "\n" + source + "\n" + entries)
    tc = build.toolchain()
    return [tc.cxx, *(f for f in tc.flags if f != "-shared"), *WARNINGS, str(src)]


def _pointwise(tmp: Path) -> list[str]:
    keys = [(a, r) for a in pointwise_native.ACTIVATIONS for r in ("false", "true")]
    symbols = [(f"pw_{a}_{r}", (a, r)) for a, r in keys]
    return _unit(tmp, "pointwise", pointwise_native.source(), symbols, "pw::entry<{}, {}>(p, f)")


def _stem(tmp: Path) -> list[str]:
    symbols = [(f"stem_{a}", (a,)) for a in pointwise_native.ACTIVATIONS]
    return _unit(tmp, "stem", stem_conv.source(), symbols, "sc::entry<{}>(p, f)")


def _global_pool(tmp: Path) -> list[str]:
    symbols = [(global_pool.SYMBOL, ())]
    return _unit(tmp, "global_pool", global_pool.source(), symbols, "gp::entry(p, f)")


def _launch(tmp: Path) -> list[str]:
    symbols = [(native_launch.SYMBOL, ())]
    return _unit(tmp, "launch", native_launch.source(), symbols, "nl::entry(p, f)")


def _im2col(tmp: Path) -> list[str]:
    symbols = [(name, (call,)) for name, call in gemm_conv.ENTRIES.items()]
    return _unit(tmp, "im2col", gemm_conv.source(), symbols, "{}")


# NOTE: every shipped file, and the command that compiles it (a header: the units including it)
COMPILED: dict[str, Callable[[Path], list[str]]] = {
    "guards/csrc/evaluator.cpp": lambda tmp: _evaluator(tmp, "evaluator.cpp"),
    "guards/csrc/torch_layout_check.cpp": lambda tmp: _evaluator(tmp, "torch_layout_check.cpp"),
    "codegen/csrc/prelude.h": _prelude,
    "codegen/csrc/native_hash.cpp": _hash,
    "codegen/csrc/depthwise.h": _depthwise,
    "codegen/csrc/pointwise.h": _pointwise,
    "codegen/csrc/stem_conv.h": _stem,
    "codegen/csrc/im2col.h": _im2col,
    "codegen/csrc/global_pool.h": _global_pool,
    "codegen/csrc/launch.h": _launch,
}
INCLUDED = {"guards/csrc/torch_layout.h": ("evaluator.cpp", "torch_layout_check.cpp")}


def test_every_shipped_source_is_compiled_here() -> None:
    assert _shipped() == set(COMPILED) | set(INCLUDED)
    for header, units in INCLUDED.items():
        for unit in units:
            text = (ROOT / Path(header).parent / unit).read_text()
            assert f'#include "{Path(header).name}"' in text


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_source_compiles_without_warnings(name: str, tmp_path: Path) -> None:
    """``-Wall -Werror``: a warning fails CI (torch_layout_check.cpp's static_asserts compare
    torch_layout.h with THPVariable of the installed torch)."""
    cmd = COMPILED[name](tmp_path)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"


def test_package_data_ships_every_source() -> None:
    """pyproject's setuptools package-data globs cover every file (so ``pip install .`` has
    them) and importlib.resources reads them as the builds do."""
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["plait"]
    for name in _shipped():
        assert any(fnmatch.fnmatch(name, g) for g in globs), name
    assert set(native.sources()) == set(native.SOURCES)
    for name, text in native.sources().items():
        assert text == (ROOT / "guards/csrc" / name).read_text()
    assert native_hash.source() == (ROOT / "codegen/csrc/native_hash.cpp").read_text()
    assert prelude.source() == (ROOT / "codegen/csrc/prelude.h").read_text()
    assert depthwise_conv.source() == (ROOT / "codegen/csrc/depthwise.h").read_text()
    assert global_pool.source() == (ROOT / "codegen/csrc/global_pool.h").read_text()


def test_caches_key_on_the_files_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """An edit of any shipped file changes the key of what is built from it: no stale
    library after a source edit."""
    key = native.build_key("c++", "1")
    for name in native.SOURCES:
        edited = {**native.sources()}
        edited[name] += "\n// edited\n"
        monkeypatch.setattr(native, "sources", lambda edited=edited: edited)
        assert native.build_key("c++", "1") != key, name
    # NOTE: the prelude and the hasher are keyed by their text (build.unit_key of Unit.text,
    # installed_library's source): the text is the file's, filled in only at its marker
    header = prelude.source()
    head, tail = header.split(prelude._MARK)
    assert prelude.PRELUDE.startswith(head) and prelude.PRELUDE.endswith(tail)
    assert build.Unit(["f"], ["int f;"]).text().startswith(prelude.PRELUDE)


def test_torch_layout_matches_the_running_torch() -> None:
    """The evaluator loaded (its configure() compares torch_layout.h's impl_of with
    ``Tensor._cdata``) and reads each kind of plain tensor's state as Python does."""
    assert native.status().available, native.status().reason
    base = torch.arange(6.0)
    for t in (base, nn.Parameter(torch.ones(3)), base[2:], torch.empty(0), base.view(2, 3)):
        assert native.tensor_state(t) == (t._version, t.data_ptr())

"""``backend="tvm"`` and ``StaxOptions(kernels="tvm")`` end to end: the manifest's records
(printer per kernel, TVM's toolchain), a kernel TVM does not print shown by ``plait.explain``,
the clear error without TVM, the content-addressed kernel cache (keys, a warm process that runs
no compiler), and tuning (the log beside the kernel, reused)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import plait
from plait.codegen import tvm_build
from plait.codegen.options import StaxOptions
from plait.codegen.tvm_build import TvmKernel, build_tvm_kernels, kernel_key
from plait.codegen.tvm_kernels import choose_tvm
from plait.errors import PlaitCompileError
from plait.ir import GraphBuilder, TensorType
from plait.runtime import compile_graph

pytestmark = pytest.mark.xdist_group("tvm-backend")


def _softmax_graph(rows: int = 8, cols: int = 64) -> object:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((rows, cols), torch.float32))
    gb.output(gb.call("softmax", gb.call("mul", x, 0.5), dim=1))
    return gb.build()


def test_backend_tvm_records_printers_and_toolchain() -> None:
    f = plait.compile(lambda x: torch.softmax(x * 2, dim=-1) + 1, backend="tvm")
    x = torch.randn(4, 32)
    torch.testing.assert_close(f(x), torch.softmax(x * 2, dim=-1) + 1)
    m = plait.explain(f).specializations[0].manifest
    assert m.options["backend"] == "tvm"
    assert m.executor["options"]["kernels"] == "tvm"
    assert {k["printer"] for k in m.kernels["kernels"]} == {"tvm"}
    assert m.toolchain["tvm"]["target"]["kind"] == "llvm"
    assert all("[TVM]" in n["detail"] for n in m.executor["evidence"]["nodes"]
               if n["executor"] == "native" and n["detail"].startswith("kernel"))  # fmt: skip


def test_a_kernel_tvm_does_not_print_is_shown_by_explain() -> None:
    f = plait.compile(lambda x, e: torch.pow(x, e) + 1, backend="tvm")
    x = torch.tensor([2, 3, -1, 0], dtype=torch.int32)
    e = torch.tensor([3, 2, 5, 1], dtype=torch.int32)
    assert torch.equal(f(x, e), torch.pow(x, e) + 1)
    report = plait.explain(f)
    (fallback,) = report.specializations[0].manifest.fallbacks
    assert "TVM → C++ printer" in fallback["what"]
    assert "exponent is not a constant" in fallback["reason"]
    assert "TVM → C++ printer" in str(report)


def test_without_tvm_a_clear_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tvm_build, "tvm_available", lambda: False)
    f = plait.compile(lambda x: x + 1, backend="tvm", options={"cache": False})
    with pytest.raises(PlaitCompileError, match=r"pip install plait\[tvm\]"):
        f(torch.ones(3))
    with pytest.raises(PlaitCompileError, match=r"pip install plait\[tvm\]"):
        compile_graph(_softmax_graph(), options=StaxOptions(kernels="tvm"))
    code = (
        "import sys; sys.modules['tvm'] = None\n"
        "from plait.codegen.tvm_build import require_tvm, tvm_available\n"
        "assert not tvm_available()\n"
        "try:\n    require_tvm()\nexcept Exception as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install plait[tvm]" in out.stdout


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="kernels="):
        StaxOptions(kernels="cuda")
    with pytest.raises(ValueError, match="tvm_tune="):
        StaxOptions(tvm_tune=-1)


def test_cache_key_names_source_tvm_version_target_and_tuning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    program = compile_graph(_softmax_graph(), options=StaxOptions(kernels="tvm"))
    kernel = program.kernels[0].tvm
    base = kernel_key(kernel)
    assert base == kernel.key
    assert kernel_key(TvmKernel(kernel.source, kernel.parallel_threshold, tune=8)) != base
    assert kernel_key(TvmKernel(kernel.source, 1 << 10)) != base
    monkeypatch.setattr(tvm_build, "tvm_version", lambda: "0.0.0")
    assert kernel_key(kernel) != base
    monkeypatch.undo()
    monkeypatch.setattr(tvm_build, "host_target", lambda: {"kind": "llvm", "mcpu": "other"})
    assert kernel_key(kernel) != base


@pytest.mark.slow
def test_a_warm_process_loads_kernels_without_compiling(stax_cache: Path) -> None:
    """The second process finds every TVM kernel in the kernel cache: with the compiler
    forbidden (``PLAIT_STAX_NO_COMPILE=1``), it builds nothing and computes the same."""
    code = (
        "import torch\n"
        "from plait.codegen.options import StaxOptions\n"
        "from plait.runtime import compile_graph\n"
        "from tests.tvm.test_tvm_backend import _softmax_graph\n"
        "p = compile_graph(_softmax_graph(16, 48), options=StaxOptions(kernels='tvm'))\n"
        "x = torch.linspace(-3, 3, 16 * 48).view(16, 48)\n"
        "print(all(k.cache_hit for k in p.kernels), p(x)[0].sum().item())\n"
    )
    env = {
        **os.environ,
        "PLAIT_CACHE_DIR": str(stax_cache),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert cold.returncode == 0, cold.stderr[-2000:]
    env["PLAIT_STAX_NO_COMPILE"] = "1"
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert warm.stdout.split()[0] == "True"
    assert warm.stdout.split()[1] == cold.stdout.split()[1]


@pytest.mark.slow
def test_tuning_keeps_its_log_beside_the_kernel_and_reuses_it(
    stax_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tvm_tune``: a few trials per kernel, the faster of the best trial and the default
    schedule; the log is published beside the library (``<key>.tuning.json``); with the
    library gone, a rebuild applies the log without searching again. (A row's sum of squares:
    a softmax of these sizes is printed in vector blocks, which tuning leaves as printed.)"""
    gb = GraphBuilder()
    xv = gb.input("x", TensorType((64, 256), torch.float32))
    gb.output(gb.call("sum", gb.call("mul", xv, xv), dims=(1,)))
    graph = gb.build()
    (choice,) = choose_tvm(
        [compile_graph(graph).plan.kernels[0].kernel], parallel_threshold=1 << 17, tune=4
    )
    kernel = choice.kernel
    assert kernel is not None
    build_tvm_kernels([kernel])
    # NOTE: long work the user asked for shows progress on stderr (plain lines off a terminal)
    assert "TVM kernels (1 tuned)" in capsys.readouterr().err
    assert kernel.tuning["trials"] == 4 and kernel.tuning["chosen"] in ("tuned", "default")
    assert not kernel.tuning["from_log"] and kernel.tuning["seconds"] > 0
    library = stax_cache / "tvm" / kernel.key[:2] / f"{kernel.key}.so"
    log = library.with_name(f"{kernel.key}.tuning.json")
    assert library.exists() and log.exists()
    library.unlink()
    tvm_build._LOADED.pop(kernel.key)
    again = TvmKernel(kernel.source, kernel.parallel_threshold, tune=4)
    build_tvm_kernels([again])
    assert again.tuning["from_log"] and again.tuning["chosen"] == kernel.tuning["chosen"]
    options = StaxOptions(kernels="tvm", tvm_tune=4)
    x = torch.randn(64, 256)
    (y,) = compile_graph(graph, options=options)(x)
    torch.testing.assert_close(y, (x * x).sum(dim=1))

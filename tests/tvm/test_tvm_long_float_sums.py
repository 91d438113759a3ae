"""A float sum longer than ``tvm_script.SUM_RUN`` elements is printed by the C++ printer, which
adds it in blocks: a TVM kernel's lanes add their elements in one run each, and on a row of
100003 float32 values that run's error against float64 was 12x eager's (the gate's reduction
rule failed). The fallback is recorded with its reason; rows of ``SUM_RUN`` stay on TVM."""

from __future__ import annotations

import pytest
import torch

import plait
import plait.conformance
from plait.codegen.tvm_script import SUM_RUN

pytestmark = pytest.mark.xdist_group("tvm-long-sums")


def _row_sum(a: torch.Tensor) -> torch.Tensor:
    return a.sum(1)


def test_a_long_float_sum_passes_the_gate_through_the_cpp_printer() -> None:
    x = torch.randn(16, 12 * SUM_RUN + 7)
    compiled = plait.compile(_row_sum, backend="tvm", options={"cache": False})
    report = plait.conformance.check(_row_sum, compiled, (x,), op_class="reduction")
    assert report.ok, report
    fallbacks = plait.explain(compiled).specializations[-1].manifest.fallbacks
    assert any("float sum over" in f["reason"] for f in fallbacks), fallbacks


@pytest.mark.slow
def test_a_sum_of_the_longest_run_stays_on_tvm() -> None:
    x = torch.randn(8, SUM_RUN)
    compiled = plait.compile(_row_sum, backend="tvm", options={"cache": False})
    report = plait.conformance.check(_row_sum, compiled, (x,), op_class="reduction")
    assert report.ok, report
    manifest = plait.explain(compiled).specializations[-1].manifest
    assert {k["printer"] for k in manifest.kernels["kernels"]} == {"tvm"}, manifest.fallbacks

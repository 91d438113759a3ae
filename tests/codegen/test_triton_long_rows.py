"""Reductions over rows of 2**31 elements or more in Triton kernels.

A static row was reduced by ``for roffset in range(0, ROW, RBLOCK)``. Triton types an integer
literal of 2**31 to 2**32 - 1 as uint32 (and one that fits as int32), and its ``for`` loop
compares signed: a row of 2**31 + 5000 elements ran no chunk at all and its sum came back 0 on an
H200 (eager: -1075841748), silently; a row just short of 2**31 would step its int32 offset past
2**31 - 1. Such rows now loop over an int64 offset until the row's end, as a symbolic row does.

Triton's interpreter runs a ``range`` in Python, where no bound overflows, so the printed
kernels are checked here; tests/gpu/test_triton_long_rows.py runs them on a GPU.
"""

from __future__ import annotations

import re

import pytest
import torch

from plait.codegen.fusion import plan_graph
from plait.codegen.plan import KernelStep
from plait.codegen.triton import print_triton
from plait.ir import GraphBuilder, TensorType

LIMIT = 2**31


def _printed_sum(shape: tuple[int, ...], dims: list[int]) -> list[str]:
    gb = GraphBuilder()
    x = gb.input("x", TensorType(shape, torch.int8))
    gb.output(gb.call("sum", x, dims=dims))
    plan = plan_graph(gb.build())
    sources = []
    for k, step in enumerate(plan.steps):
        assert isinstance(step, KernelStep), step
        sources.append(print_triton(step.lowered.kernel, f"k{k}").source)
    return sources


def _range_bounds(source: str) -> list[tuple[int, int]]:
    """(end, step) of each ``range(start, end, step)`` loop with literal bounds."""
    return [(int(e), int(s)) for e, s in re.findall(r"range\(\d+, (\d+), (\d+)\)", source)]


@pytest.mark.parametrize("row", [LIMIT - 1000, LIMIT + 5000, 2 * LIMIT + 3])
def test_a_row_past_int32_loops_over_an_int64_offset(row: int) -> None:
    (source,) = _printed_sum((row,), [0])
    for end, step in _range_bounds(source):
        assert end + step < LIMIT, f"a for loop over an int32 or uint32 bound:\n{source}"
    assert "roffset = tl.full([], 0, tl.int64)" in source, source
    assert f"while roffset < {row}:" in source, source


def test_rows_that_fit_keep_their_for_loop() -> None:
    (source,) = _printed_sum((3, 5000), [1])
    assert _range_bounds(source) == [(5000, 1024)], source
    assert "while" not in source

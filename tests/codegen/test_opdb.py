"""Every op of the op database compiled alone by Stax, judged by the conformance gate.

Each sample (odd sizes, broadcasting, size-0 and size-1 dims, every dtype the op declares) is
compiled; all kernels of a family are built together once. The gate draws fresh inputs like the
sample's (the sample is one more case), stresses them, anchors 16-bit results on float64, checks
channels_last for 4-D inputs, and holds each op to its contract row. Tolerances come from the
contract, never from this file. Non-contiguous inputs are checked bitwise against their
contiguous copies (the gate itself feeds contiguous tensors). The kernels are built in the
session's batch (``stax_batch``) with the special-value variants of the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import plait.conformance
from plait.ir import Graph, interpret
from plait.ir.ops import get_op
from plait.runtime import StaxProgram
from tests.codegen.stax_helpers import (
    BATCH_GROUP,
    TRITON_STAND_INS,
    Batch,
    compile_in_batch,
    evaluate64,
    graph_of,
    has_4d_float,
    op_class,
)
from tests.ir import opdb
from tests.util import assert_bitwise


def _pointwise(op: str) -> bool:
    return get_op(op).category.value == "pointwise"


POINTWISE = [(o, d) for o, d in opdb.cases() if _pointwise(o)]
# NOTE: the gate draws fresh inputs, and random bytes are no valid generator state:
# rng_set_state is checked by tests/ir/test_opdb.py and tests/capture/test_rng_replay.py
OTHER = [(o, d) for o, d in opdb.cases() if not _pointwise(o) and o != "rng_set_state"]


def _ids(cases: list[tuple[str, torch.dtype]]) -> list[str]:
    return [f"{o}-{str(d)[6:]}" for o, d in cases]


@dataclass
class Compiled:
    sample: opdb.Sample
    graph: Graph
    inputs: list[torch.Tensor]
    program: StaxProgram


Table = dict[tuple[str, torch.dtype], list[Compiled]]


def _items(
    cases: list[tuple[str, torch.dtype]],
) -> list[tuple[Graph, tuple[str, torch.dtype, opdb.Sample, list[torch.Tensor]]]]:
    items = []
    for op, dtype in cases:
        for sample in opdb.samples(op, dtype):
            graph, inputs = graph_of(sample)
            items.append((graph, (op, dtype, sample, inputs)))
    return items


compile_in_batch("opdb-pointwise", lambda: _items(POINTWISE))
compile_in_batch("opdb-other", lambda: _items(OTHER))


def _table(batch: Batch, name: str) -> Table:
    out: Table = {}
    for (op, dtype, sample, inputs), graph, program in batch[name]:
        out.setdefault((op, dtype), []).append(Compiled(sample, graph, inputs, program))
    return out


@pytest.fixture(scope="module")
def pointwise(stax_batch: Batch) -> Table:
    return _table(stax_batch, "opdb-pointwise")


@pytest.fixture(scope="module")
def other(stax_batch: Batch) -> Table:
    return _table(stax_batch, "opdb-other")


def _check(table: Table, op: str, dtype: torch.dtype, part: slice = slice(None)) -> None:
    for c in table[(op, dtype)][part]:
        graph = c.graph
        report = plait.conformance.check(
            lambda *xs, g=graph: interpret(g, xs),
            c.program,
            tuple(c.inputs),
            op_class=op_class(op),
            reference64=evaluate64(graph),
            layouts=("contiguous", "channels_last") if has_4d_float(c.inputs) else ("contiguous",),
            draws=1,
            special_values=op not in TRITON_STAND_INS,
        )
        assert report.ok, f"{op} {dtype} {c.sample.desc} {c.sample.attrs}:\n{report}"


def _noncontiguous(table: Table, op: str, dtype: torch.dtype) -> None:
    """Native kernels read a non-contiguous input through its contiguous copy: same bits.
    (Externs and fallbacks get the layout PyTorch is given; the gate checks channels_last.)"""
    for c in table[(op, dtype)]:
        counts = c.program.evidence.counts
        if all(t.is_contiguous() for t in c.inputs) or counts["extern"] or counts["fallback"]:
            continue
        torch.manual_seed(0)
        got = c.program(*c.inputs)
        torch.manual_seed(0)
        want = c.program(*[t.contiguous() for t in c.inputs])
        for a, b in zip(got, want):
            assert_bitwise(a, b, f"{op} {dtype} {c.sample.desc}")


@pytest.mark.xdist_group(BATCH_GROUP)
@pytest.mark.parametrize(("op", "dtype"), POINTWISE, ids=_ids(POINTWISE))
def test_pointwise_op_conforms(pointwise: Table, op: str, dtype: torch.dtype) -> None:
    """Every other sample through the gate (the rest: the slow test); all bitwise in layouts."""
    _check(pointwise, op, dtype, slice(0, None, 2))
    _noncontiguous(pointwise, op, dtype)


@pytest.mark.slow
@pytest.mark.xdist_group(BATCH_GROUP)
@pytest.mark.parametrize(("op", "dtype"), POINTWISE, ids=_ids(POINTWISE))
def test_pointwise_op_conforms_rest(pointwise: Table, op: str, dtype: torch.dtype) -> None:
    _check(pointwise, op, dtype, slice(1, None, 2))


@pytest.mark.xdist_group(BATCH_GROUP)
@pytest.mark.parametrize(("op", "dtype"), OTHER, ids=_ids(OTHER))
def test_op_conforms(other: Table, op: str, dtype: torch.dtype) -> None:
    """Reductions, normalizations, views, constants, externs, random and opaque ops."""
    _check(other, op, dtype)
    _noncontiguous(other, op, dtype)

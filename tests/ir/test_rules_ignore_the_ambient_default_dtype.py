"""The IR's type rules never read ``torch.get_default_dtype()``: where eager takes the default
(an integer tensor with a float scalar, math on integers, integer true division) a rule gives
float32 under any default in force, so a graph types the same wherever it is built, verified or
loaded (capture casts operands to another default itself: ``frontend.default_dtype``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from plait.ir import GraphBuilder, TensorType, from_text, to_text
from plait.ir.ops.rules import default_reads


@pytest.fixture(params=[torch.float64, torch.float16, torch.bfloat16], ids=str)
def other_default(request: pytest.FixtureRequest) -> Iterator[torch.dtype]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(request.param)
    try:
        yield request.param
    finally:
        torch.set_default_dtype(before)


def _graph() -> GraphBuilder:
    b = GraphBuilder()
    i = b.input("i", TensorType((4,), torch.int64))
    b.output(
        b.call("mul", i, 0.5),
        b.call("div", i, 3, rounding_mode=None),
        b.call("sqrt", i),
        b.call("clamp", i, min=0.5, max=None),
        b.call("logsumexp", i, dims=[0], keepdim=False),
        b.call("lt", i, 0.5),
    )
    return b


def test_rules_give_float32_under_another_default(other_default: torch.dtype) -> None:
    g = _graph().build()
    dtypes = [o.type.dtype for o in g.outputs]
    assert dtypes == [torch.float32] * 5 + [torch.bool]


def test_graph_built_under_float32_verifies_under_another_default() -> None:
    text = to_text(_graph().build())
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert to_text(from_text(text)) == text
    finally:
        torch.set_default_dtype(before)


def test_rules_note_where_they_take_the_default() -> None:
    b = GraphBuilder()
    i = b.input("i", TensorType((4,), torch.int64))
    x = b.input("x", TensorType((4,), torch.float64))
    with default_reads() as reads:
        b.call("mul", x, 0.5)
        b.call("add", i, 2, alpha=1)
        b.call("sqrt", x)
    assert reads == []
    with default_reads() as reads:
        b.call("lt", i, 0.5)
    assert len(reads) == 1

"""The aten_datadep node: unbacked sizes named by its ``sizes`` attribute, typed by the meta
kernel under a shape environment, refused with a clear TypeRuleError otherwise; the
interpreter binds each size from the result that makes it."""

from __future__ import annotations

import pytest
import torch

from plait.ir import GraphBuilder, TensorType, interpret
from plait.ir.ops import TypeRuleError
from plait.symbolic import is_unbacked, symbol, unbacked_symbol
from tests.util import assert_bitwise


def _masked(sizes: str, x_type: TensorType | None = None) -> tuple[GraphBuilder, list]:
    gb = GraphBuilder()
    x = gb.input("x", x_type or TensorType((4, 3), torch.float32))
    m = gb.call("gt", x, 0.0)
    return gb, gb.call("aten_datadep", [x, m], name="masked_select", sizes=sizes)


def test_the_node_names_its_unbacked_size() -> None:
    _, (picked,) = _masked("dd3")
    assert picked.type.shape == (unbacked_symbol(3),)
    assert is_unbacked(picked.type.shape[0]) and not is_unbacked(symbol("s0"))


@pytest.mark.parametrize(
    ("sizes", "says"),
    [("", "makes 1 data-dependent size"), ("dd0,dd1", "makes 1"), ("s0", "not an unbacked")],
)
def test_a_wrong_sizes_attribute_is_refused(sizes: str, says: str) -> None:
    with pytest.raises(TypeRuleError, match=says):
        _masked(sizes)


def test_operands_of_symbolic_shape_are_refused() -> None:
    with pytest.raises(TypeRuleError, match="static shape"):
        _masked("dd0", TensorType((symbol("s0"), 3), torch.float32))


def test_the_interpreter_binds_each_size_on_fresh_draws() -> None:
    gb, (picked,) = _masked("dd0")
    gb.output(picked, gb.call("sum", picked))
    graph = gb.build()
    sizes = set()
    for seed in range(4):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed))
        got, total = interpret(graph, [x])
        assert_bitwise(got, x[x > 0], f"draw {seed}")
        assert_bitwise(total, x[x > 0].sum(), f"draw {seed}")
        sizes.add(got.shape[0])
    assert len(sizes) > 1

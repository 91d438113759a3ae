"""The IR text parser reads each production of the grammar on its own (plait.ir.parser.Parser),
and its errors name the line, the column and what the production expected."""

from __future__ import annotations

import pytest
import torch

from plait.ir import IRParseError, ScalarType, TensorType, from_text, to_text
from plait.ir.parser import Parser
from plait.ir.types import NoneType


def test_each_literal_kind_is_one_production() -> None:
    p = Parser('[1, -2.5, true, none, "a\\"b", f16, (s0 + 1), []]')
    value = p.literal(",]")
    assert value[:6] == (1, -2.5, True, None, 'a"b', torch.float16)
    assert str(value[6]) == "s0 + 1" and value[7] == ()
    assert p.pos == len(p.text)


def test_types_and_attrs_are_productions() -> None:
    assert Parser("f32[2, 3]@cuda:0, none, int").types() == [
        TensorType((2, 3), torch.float32, "cuda:0"),
        NoneType(),
        ScalarType("int"),
    ]
    assert Parser("{dims=[1], keepdim=true}").attrs() == {"dims": (1,), "keepdim": True}


@pytest.mark.parametrize(
    ("text", "production", "column", "expected"),
    [
        ("{dims=[1] keepdim=true}", "attrs", 11, "expected ','"),
        ("{=1}", "attrs", 2, "expected an attribute name"),
        ("@", "literal", 1, "expected a literal"),
        ('"open', "literal", 1, "unterminated or invalid string"),
        ("f32[2]@gpu", "type", 8, "expected a device"),
        ("f32[(s0 +)]", "type", 10, "bad dimension"),
        ("[1, 2", "literal", 6, "expected ']'"),
    ],
)
def test_a_production_names_where_and_what_it_expected(
    text: str, production: str, column: int, expected: str
) -> None:
    parser = Parser(text)
    args = (",]",) if production == "literal" else ()
    with pytest.raises(IRParseError) as info:
        getattr(parser, production)(*args)
    assert expected in info.value.reason
    assert (info.value.line, info.value.column) == (1, column), str(info.value)


def test_outputs_production_reads_the_return_line() -> None:
    text = "graph(\n  user %x: f32[2]\n) {\n  return %x, 2, none\n}"
    g = from_text(text)
    assert [getattr(o, "name", o) for o in g.outputs] == ["x", 2, None]
    assert to_text(g) == text
    with pytest.raises(IRParseError) as info:
        from_text("graph(\n  user %x: f32[2]\n) {\n  return %x %x\n}")
    assert (info.value.line, info.value.column) == (4, 13) and "expected '}'" in info.value.reason


def test_a_graph_prints_as_its_text() -> None:
    text = "graph(\n  user %x: f32[2, 3]\n) {\n  %0 = sum(%x) {dims=[1]} : f32[2]\n  return %0\n}"
    g = from_text(text)
    assert str(g) == repr(g) == to_text(g) == text

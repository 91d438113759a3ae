"""The text format: golden files, exact round trip, and parse errors that point at the problem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hypothesis import given

from plait.ir import Graph, IRParseError, from_text, interpret, parse_type, to_text
from plait.ir.types import TensorType
from tests.ir.graphs import GOLDEN, graphs
from tests.util import assert_bitwise, graph_structure

GOLDEN_DIR = Path(__file__).parent / "golden"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_text(name: str) -> None:
    """Printing is stable. To accept a deliberate format change: PLAIT_UPDATE_GOLDEN=1."""
    text = to_text(GOLDEN[name]()) + "\n"
    path = GOLDEN_DIR / f"{name}.ir"
    if os.environ.get("PLAIT_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_parses_back(name: str) -> None:
    text = (GOLDEN_DIR / f"{name}.ir").read_text()
    assert to_text(from_text(text)) + "\n" == text


def _fresh_inputs(g: Graph, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for v in g.inputs:
        assert isinstance(v.type, TensorType)
        shape = tuple(int(d) for d in v.type.shape)
        out.append(torch.randn(shape, generator=gen, dtype=torch.float64).to(v.type.dtype))
    return out


@given(graphs())
def test_round_trip_is_exact_and_behaves_identically(g: Graph) -> None:
    text = to_text(g)
    parsed = from_text(text)
    assert to_text(parsed) == text
    inputs = _fresh_inputs(g, 7)
    torch.manual_seed(3)
    expected = interpret(g, inputs)
    torch.manual_seed(3)
    got = interpret(parsed, inputs)
    for a, b in zip(expected, got):
        assert_bitwise(a, b, "parsed graph")


def _general_path_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from plait.ir import parser

    never = re.compile(r"(?!)")
    monkeypatch.setattr(parser, "_FAST_STMT_RE", never)
    monkeypatch.setattr(parser, "_FAST_INPUT_RE", never)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_fast_path_parses_as_the_general_path(name: str) -> None:
    """The one-match statement and input forms give exactly what the general parser gives."""
    text = (GOLDEN_DIR / f"{name}.ir").read_text()
    fast = from_text(text)
    with pytest.MonkeyPatch.context() as m:
        _general_path_only(m)
        general = from_text(text)
    assert graph_structure(fast) == graph_structure(general)


@given(graphs())
def test_fast_path_agrees_on_generated_graphs(g: Graph) -> None:
    text = to_text(g)
    fast = from_text(text)
    with pytest.MonkeyPatch.context() as m:
        _general_path_only(m)
        general = from_text(text)
    assert graph_structure(fast) == graph_structure(general)


def test_literal_spellings_round_trip() -> None:
    text = """graph(
  user %x: f64[3]
) {
  %a = add(%x, 1e-07) : f64[3]
  %b = mul(%a, -2) : f64[3]
  %c = clamp(%b) {min=-inf, max=0.1} : f64[3]
  %d = where(%m, %c, nan) : f64[3]
  return %d
}"""
    with pytest.raises(IRParseError, match="used before it is defined"):
        from_text(text)
    fixed = text.replace("where(%m, %c, nan)", "add(%c, nan)")
    assert to_text(from_text(fixed)) == fixed


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        (
            "graph(\n  user %x: f32[2]\n) {\n  %0 = frobnicate(%x) : f32[2]\n  return %0\n}",
            4,
            8,
            "unknown op 'frobnicate'",
        ),
        (
            "graph(\n  user %x: f32[2]\n) {\n  %0 = relu(%y) : f32[2]\n  return %0\n}",
            4,
            13,
            "used before it is defined",
        ),
        ("graph(\n  user %x: f33[2]\n) {\n  return %x\n}", 2, 12, "unknown dtype 'f33'"),
        ("graph(\n  user %x: f32[2\n) {\n  return %x\n}", 3, 1, "expected ']'"),
        ("graph(\n  person %x: f32[2]\n) {\n  return %x\n}", 2, 3, "unknown input kind"),
        (
            "graph(\n  user %x: f32[2]\n) {\n  %0 = relu(%x) {bogus=1} : f32[2]\n  return %0\n}",
            4,
            8,
            "unknown attribute",
        ),
        (
            "graph(\n  user %x: f32[2]\n) {\n  %x = relu(%x) : f32[2]\n  return %x\n}",
            4,
            3,
            "defined twice",
        ),
        (
            "graph(\n  user %x: f32[2]\n) {\n  %0 = relu(%x)  f32[2]\n  return %0\n}",
            4,
            18,
            "expected ':'",
        ),
    ],
)
def test_parse_errors_name_line_and_column(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(IRParseError) as info:
        from_text(text)
    err = info.value
    assert message in str(err)
    assert (err.line, err.column) == (line, column), str(err)


def test_parse_type() -> None:
    t = parse_type("bf16[2, (s0 + 1)]@cuda:1")
    assert isinstance(t, TensorType) and t.device == "cuda:1" and t.dtype == torch.bfloat16
    with pytest.raises(IRParseError):
        parse_type("f32[2] extra")


def test_parsed_graph_is_verified() -> None:
    text = "graph(\n  user %x: f32[2]\n) {\n  %0 = relu(%x) : f32[3]\n  return %0\n}"
    with pytest.raises(Exception, match="type rule gives f32\\[2\\]"):
        from_text(text)
    assert from_text(text, verify=False).nodes[0].outputs[0].type == TensorType((3,), torch.float32)


@pytest.mark.parametrize(
    ("canonical", "spaced"),
    [
        ("f32[1, 3, 224, 224]", "f32[ 1 ,3,  224 , 224 ]"),
        ("f32[]", "f32[ ]"),
        ("i64[0, 7]@cpu", "i64[0 ,7]@cpu"),
        ("bf16[2, 3]@cuda:1", "bf16[2 , 3]@cuda:1"),
        ("bool[5]", "bool[ 5]"),
    ],
)
def test_static_types_parse_alike_in_every_spelling(canonical: str, spaced: str) -> None:
    """Types as to_text prints them take a one-match path; other spellings the general one:
    the same types either way, and errors stay errors."""
    t = parse_type(canonical)
    assert t == parse_type(spaced) and str(t) == canonical.replace("@cpu", "")
    for bad in (canonical + "@gpu", canonical.replace("[", "[-1, ", 1), "f33" + canonical[3:]):
        with pytest.raises(IRParseError):
            parse_type(bad)

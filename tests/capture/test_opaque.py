"""Calls with no capture rule whose arguments include literals become ``opaque`` nodes carrying
the literals (under ``fullgraph=False``: counted, warned about, recorded), bitwise equal to eager
on fresh inputs; a literal JSON cannot give back exactly keeps the eager fallback."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.frontend import capture_program
from plait.ir import from_text, to_text
from tests.capture.helpers import assert_same, opaque_path  # noqa: F401  (fixture)

# NOTE: these tests exercise opaque nodes: the ATen trace, which comes first, is off
pytestmark = pytest.mark.usefixtures("opaque_path")

# name: (program, expected (target, literals, kwliterals) of its opaque nodes)
CASES: dict[str, tuple[Any, list[tuple[str, str, str]]]] = {
    "cumprod": (lambda x: x.cumprod(0), [("torch.Tensor.cumprod", '[{"t": 0}, 0]', "")]),
    "logcumsumexp": (
        lambda x: torch.logcumsumexp(x, 0),
        [("torch.logcumsumexp", '[{"t": 0}, 0]', "")],
    ),
    "list_literal": (
        lambda x: torch.nanmean(x, [0]),
        [("torch.nanmean", '[{"t": 0}, [0]]', "")],
    ),
    "tuple_literal": (
        lambda x: x.nanmean((0, 1)),
        [("torch.Tensor.nanmean", '[{"t": 0}, {"tuple": [0, 1]}]', "")],
    ),
    "keywords": (
        lambda x: torch.cumprod(x, dim=1) * torch.nanmean(x, dim=(0, 1)),
        [
            ("torch.cumprod", "", '{"dim": 1}'),
            ("torch.nanmean", "", '{"dim": {"tuple": [0, 1]}}'),
        ],
    ),
    "float_literals": (
        lambda x: (
            torch.isclose(x.log(), x, 0.25, atol=math.inf)
            | torch.special.xlog1py(x, -1e300).isnan()
        ),
        [
            ("torch.isclose", '[{"t": 0}, {"t": 1}, 0.25]', '{"atol": Infinity}'),
            ("torch.special.xlog1py", '[{"t": 0}, -1e+300]', ""),
        ],
    ),
    "strings_and_nested_tensors": (
        # NOTE: diagonals (an index repeated in one operand): einsum's rule has no IR op for them
        lambda x: torch.einsum("ii,ij->j", [x, x.t()]) + torch.einsum("ii->i", x),
        [
            ("torch.functional.einsum", '["ii,ij->j", [{"t": 0}, {"t": 1}]]', ""),
            ("torch.functional.einsum", '["ii->i", {"t": 0}]', ""),
        ],
    ),
    "none_and_bool": (
        lambda x: torch.std_mean(x, None, correction=0, keepdim=True)[0],
        [("torch.std_mean", '[{"t": 0}, null]', '{"correction": 0, "keepdim": true}')],
    ),
}


def _opaque_attrs(graph: Any) -> list[tuple[str, str, str]]:
    return [
        (n.attrs["target"], n.attrs["literals"], n.attrs["kwliterals"])
        for n in graph.nodes
        if n.op == "opaque"
    ]


@pytest.mark.parametrize("name", sorted(CASES))
def test_literal_arguments_become_opaque_nodes(name: str) -> None:
    fn, expected = CASES[name]
    compiled = plait.compile(fn, backend="eager")
    for i in range(3):
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i)).abs() + 0.5
        if i == 0:
            with pytest.warns(CaptureFallbackWarning, match="opaque PyTorch nodes"):
                got = compiled(x)
        else:
            got = compiled(x)
        assert_same(got, fn(x), f"call {i}")
    assert len(compiled.specializations) == 1
    spec = compiled.specializations[0]
    assert spec.fallback_reason is None
    assert _opaque_attrs(spec.graph) == expected
    assert spec.opaque_counts == {t: [e[0] for e in expected].count(t) for t, _, _ in expected}
    back = from_text(to_text(spec.graph))  # NOTE: the literals survive the IR's text form
    assert to_text(back) == to_text(spec.graph)
    assert _opaque_attrs(back) == expected


def test_literal_calls_are_errors_under_fullgraph() -> None:
    for fn, _ in CASES.values():
        with pytest.raises(
            GraphCaptureError, match=r"no capture rule maps|cannot lower this call"
        ) as info:
            plait.capture(fn, (torch.randn(4, 4),))
        assert info.value.kind == "unsupported"


def test_tensors_only_calls_keep_their_plain_form() -> None:
    prog = capture_program(lambda x: torch.msort(x), (torch.randn(2, 3),), fullgraph=False)
    assert _opaque_attrs(prog.graph) == [("torch.msort", "", "")]


# name: (program, why it cannot be an opaque node)
REFUSED: dict[str, tuple[Any, str]] = {
    "generator": (
        lambda x: torch.bernoulli(x.sigmoid(), generator=torch.Generator()),
        "a Generator argument",
    ),
    # NOTE: refused before the call runs (so the invalid calls below never reach PyTorch)
    "object": (lambda x: torch.tensordot(x, x, dims=object()), "a object argument"),
    "dict_with_tensor_keys": (
        lambda x: torch.tensordot(x, x, dims={x: 0}),
        "a dict argument",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_literals_json_cannot_give_back_keep_the_fallback(name: str) -> None:
    fn, why = REFUSED[name]
    prog = capture_program(fn, (torch.randn(3, 3),), fullgraph=False)
    assert prog.graph is None, name
    assert "cannot be an opaque node" in str(prog.fallback_reason)
    assert why in str(prog.fallback_reason), prog.fallback_reason


def test_a_refused_literal_runs_eagerly_and_bitwise() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.poisson(x.exp(), generator=torch.Generator().manual_seed(3))

    compiled = plait.compile(fn, backend="eager")
    x = torch.randn(5)
    with pytest.warns(CaptureFallbackWarning, match="eagerly"):
        assert_same(compiled(x), fn(x))


def test_json_round_trip_of_special_floats() -> None:
    # NOTE: what the literal check relies on: Python's json keeps inf and the default nan's
    # bits, and writes no negative-nan sign.
    assert json.loads(json.dumps(math.inf)) == math.inf
    assert math.copysign(1.0, json.loads(json.dumps(-math.nan))) == 1.0
    assert json.loads(json.dumps(-0.0)).hex() == "-0x0.0p+0"

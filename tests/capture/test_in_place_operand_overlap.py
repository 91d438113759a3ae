"""An in-place call whose operand shares memory with the tensor it writes, other than element for
element (a shifted view ``x[:, 1:].add_(x[:, :-1])``, a row broadcast over its own tensor
``x.t().add_(x.t()[0])``), reads in eager elements the same call already wrote, in PyTorch's
order of visits; the captured graph reads every operand before the write, which gave other values.
Such a call is refused at capture (the recorded eager fallback, ``GraphCaptureError`` under
``fullgraph=True``). Operands that interleave without sharing an element, or are the written
view itself, compile as before."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import GraphCaptureError
from plait.frontend.writes import partial_overlap
from tests.util import assert_bitwise, contract_tol


def _shifted(x: torch.Tensor) -> torch.Tensor:
    x[:, 1:].add_(x[:, :-1])
    return x * 2


def _row_broadcast(x: torch.Tensor) -> torch.Tensor:
    x.t().add_(x.t()[0])
    return x + 1


def _interleaved(x: torch.Tensor) -> torch.Tensor:
    x[:, ::2].add_(x[:, 1::2])
    return x * 2


def _same_view(x: torch.Tensor) -> torch.Tensor:
    x.mul_(x.view(x.shape))
    return x - 1


REFUSED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "shifted": _shifted,
    "row_broadcast": _row_broadcast,
}
COMPILED = {"interleaved": _interleaved, "same_view": _same_view}


@pytest.mark.parametrize("name", REFUSED)
def test_overlapping_operand_runs_eagers_writes(name: str) -> None:
    fn = REFUSED[name]
    compiled = plait.compile(fn)
    for call in range(2):
        x = torch.randn(4, 6)
        x_eager = x.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compiled(x)
        assert_bitwise(got, fn(x_eager), f"call {call}: output")
        assert_bitwise(x, x_eager, f"call {call}: input after the call")
    assert all(
        s.fallback_reason and "overlaps" in s.fallback_reason for s in compiled.specializations
    )


@pytest.mark.parametrize("name", REFUSED)
def test_overlapping_operand_refused_under_fullgraph(name: str) -> None:
    with pytest.raises(GraphCaptureError, match="overlaps in memory"):
        plait.compile(REFUSED[name], fullgraph=True)(torch.randn(4, 6))


@pytest.mark.parametrize("name", COMPILED)
def test_operand_sharing_no_element_compiles(name: str) -> None:
    fn = COMPILED[name]
    compiled = plait.compile(fn, fullgraph=True)
    for call in range(2):
        x = torch.randn(4, 6)
        x_eager = x.clone()
        assert_bitwise(compiled(x), fn(x_eager), f"call {call}: output")
        assert_bitwise(x, x_eager, f"call {call}: input after the call")


def test_partial_overlap_by_elements() -> None:
    x = torch.randn(6, 8)
    assert partial_overlap(x[1:], x[:-1])
    assert partial_overlap(x, x[0])  # NOTE: a row read while every row is written
    assert not partial_overlap(x[:, ::2], x[:, 1::2])
    assert not partial_overlap(x[:3], x[3:])
    assert not partial_overlap(x, x.view(6, 8))
    assert not partial_overlap(x, torch.randn(6, 8))
    assert partial_overlap(x.view(torch.int32)[:, 1:], x[:, :-1].view(torch.int32))


def test_augmented_assignment_to_a_slice_compiles() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x[:, 1:7:3] += 1
        x[1:] += x[1:].sin()
        return x * 2

    compiled = plait.compile(fn, fullgraph=True)
    tol = contract_tol("pointwise", torch.float32)
    for _ in range(2):
        x = torch.randn(5, 8)
        x_eager = x.clone()
        torch.testing.assert_close(compiled(x), fn(x_eager), **tol)
        torch.testing.assert_close(x, x_eager, **tol)


def test_slice_assigned_a_shifted_view_is_refused() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.t()[1:] = x.t()[:-1]
        return x * 2

    with pytest.raises(GraphCaptureError, match="overlaps in memory"):
        plait.compile(fn, fullgraph=True)(torch.randn(4, 6))

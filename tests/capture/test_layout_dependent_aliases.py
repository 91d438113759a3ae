"""Whether ``reshape``, ``flatten``, ``ravel`` and ``contiguous`` return a view of their operand or
a copy, and whether ``view`` succeeds at all, depends on the operand's strides. Where the program
makes that observable (it writes the result or its operand afterwards, or returns the result), a
compiled call on an input of other strides than the capture's gives eager's values, input
mutations, aliasing and errors: the strides are guarded and such a call recompiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import plait
from tests.util import assert_bitwise


def _contiguous(g: torch.Generator) -> torch.Tensor:
    return torch.randn(4, 6, generator=g)


def _transposed(g: torch.Generator) -> torch.Tensor:
    return torch.randn(6, 4, generator=g).t()


def _gapped(g: torch.Generator) -> torch.Tensor:
    return torch.randn(4, 9, generator=g)[:, 1:7]


LAYOUTS = {
    "contiguous_first": (_contiguous, _transposed),
    "transposed_first": (_transposed, _contiguous),
    "gapped_first": (_gapped, _contiguous),
    "contiguous_then_gapped": (_contiguous, _gapped),
}

PROGRAMS: dict[str, Callable[[torch.Tensor], Any]] = {
    "reshape_written": lambda x: (x.reshape(-1).mul_(2), x + 1)[1],
    "flatten_written": lambda x: (x.flatten().zero_(), x * 1)[1],
    "ravel_written": lambda x: (x.ravel().add_(3), x * 1)[1],
    "contiguous_written": lambda x: (x.contiguous().mul_(2), x + 1)[1],
    "operand_written_after_reshape": lambda x: (y := x.reshape(-1), x.mul_(2), y + 0)[2],
    "reshape_of_intermediate_written": lambda x: (y := x * 2, y.reshape(-1).add_(1), y)[2],
    "reshape_returned": lambda x: x.reshape(-1),
    "contiguous_returned": lambda x: x.contiguous(),
}


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("layouts", LAYOUTS, ids=list(LAYOUTS))
@pytest.mark.parametrize("name", PROGRAMS, ids=list(PROGRAMS))
def test_layout_dependent_alias_follows_each_call(name: str, layouts: str) -> None:
    fn = PROGRAMS[name]
    compiled = plait.compile(fn)
    for call, make in enumerate(LAYOUTS[layouts]):
        x_eager = make(torch.Generator().manual_seed(call))
        x_plait = make(torch.Generator().manual_seed(call))
        want, got = fn(x_eager), compiled(x_plait)
        assert_bitwise(got, want, f"call {call}: output")
        assert_bitwise(x_plait, x_eager, f"call {call}: input after the call")
        assert (_storage(got) == _storage(x_plait)) == (_storage(want) == _storage(x_eager)), (
            f"call {call}: the output shares the input's memory in one and not the other"
        )


VIEWS: dict[str, Callable[[torch.Tensor], Any]] = {
    "view_of_input": lambda x: x.view(-1) * 2,
    "view_of_intermediate": lambda x: (x * 2).view(-1) + 1,
}


def _expanded(g: torch.Generator) -> torch.Tensor:
    return torch.randn(4, 1, generator=g).expand(4, 6)


UNVIEWABLE = {"transposed": _transposed, "gapped": _gapped, "expanded": _expanded}


@pytest.mark.parametrize("layout", UNVIEWABLE, ids=list(UNVIEWABLE))
@pytest.mark.parametrize("name", VIEWS, ids=list(VIEWS))
def test_view_that_eager_refuses_for_new_strides_raises(name: str, layout: str) -> None:
    fn = VIEWS[name]
    compiled = plait.compile(fn)
    x = _contiguous(torch.Generator().manual_seed(0))
    assert_bitwise(compiled(x), fn(x))
    x = UNVIEWABLE[layout](torch.Generator().manual_seed(1))
    try:
        want = fn(x)
    except RuntimeError as e:
        assert "view size is not compatible" in str(e)
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            compiled(x)
    else:
        # NOTE: a product of an input with gaps or overlaps is laid out densely: its view succeeds
        assert name == "view_of_intermediate" and layout != "transposed"
        assert_bitwise(compiled(x), want)


@pytest.mark.parametrize("layout", ["gapped", "expanded"])
def test_view_of_an_input_with_gaps_or_overlaps_raises_at_its_first_call(layout: str) -> None:
    """The capture traces a copy with the caller's strides, gaps and overlaps included, so a
    ``view`` eager refuses is refused on the call that captures too."""
    compiled = plait.compile(VIEWS["view_of_input"])
    x = UNVIEWABLE[layout](torch.Generator().manual_seed(2))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        compiled(x)
    y = _contiguous(torch.Generator().manual_seed(3))
    assert_bitwise(compiled(y), VIEWS["view_of_input"](y))


@pytest.mark.parametrize("layout", ["gapped", "expanded"])
def test_reshape_of_an_input_with_gaps_or_overlaps_copies_as_eager(layout: str) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, -1) * 3

    compiled = plait.compile(fn)
    for seed in range(3):
        x = UNVIEWABLE[layout](torch.Generator().manual_seed(seed))
        assert_bitwise(compiled(x), fn(x), f"draw {seed}")


def test_view_after_contiguous_keeps_one_specialization() -> None:
    """``contiguous()`` fixes the layout ``view`` reads, so new input strides change nothing."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous().view(-1) * 2

    compiled = plait.compile(fn)
    for make in (_contiguous, _transposed):
        x = make(torch.Generator().manual_seed(0))
        assert_bitwise(compiled(x), fn(x))
    assert len(plait.explain(compiled).specializations) == 1

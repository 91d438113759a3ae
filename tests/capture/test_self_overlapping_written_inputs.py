"""An in-place write into an input whose elements share memory with each other (``as_strided``
with overlapping strides, ``expand``) reads, in eager, values the same call already wrote, in
PyTorch's order of visits: the IR's value semantics cannot say that. Such an input is refused at
capture (the recorded eager fallback, or ``GraphCaptureError`` under ``fullgraph=True``) and a
later call that passes one recompiles into that fallback, so its values and the input after the
call are eager's. An input that overlaps itself but is only read compiles as before."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import GraphCaptureError
from tests.util import assert_bitwise


def _scale(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x.sum(1)


def _overlapping(g: torch.Generator) -> torch.Tensor:
    return torch.randn(20, generator=g).as_strided((4, 5), (2, 1))


def _dense(g: torch.Generator) -> torch.Tensor:
    return torch.randn(4, 5, generator=g)


ORDERS: dict[str, tuple[Callable[[torch.Generator], torch.Tensor], ...]] = {
    "overlapping_first": (_overlapping, _dense, _overlapping),
    "dense_first": (_dense, _overlapping, _dense),
}


@pytest.mark.parametrize("order", ORDERS, ids=list(ORDERS))
def test_write_into_self_overlapping_input_is_eagers(order: str) -> None:
    compiled = plait.compile(_scale)
    for call, make in enumerate(ORDERS[order]):
        x_eager = make(torch.Generator().manual_seed(call))
        x_plait = make(torch.Generator().manual_seed(call))
        want = _scale(x_eager)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compiled(x_plait)
        assert_bitwise(got, want, f"call {call}: output")
        assert_bitwise(x_plait, x_eager, f"call {call}: input after the call")


def test_write_into_self_overlapping_input_refused_under_fullgraph() -> None:
    x = _overlapping(torch.Generator().manual_seed(0))
    with pytest.raises(GraphCaptureError, match="overlap"):
        plait.compile(_scale, fullgraph=True)(x)


def test_self_overlapping_input_only_read_compiles() -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.add_(1)
        return x.sum(1) + y

    compiled = plait.compile(fn, fullgraph=True)
    for call in range(2):
        g = torch.Generator().manual_seed(call)
        x, y = _overlapping(g), torch.randn(4, generator=g)
        y_eager = y.clone()
        assert_bitwise(compiled(x, y), fn(x, y_eager))
        assert_bitwise(y, y_eager)

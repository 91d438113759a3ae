"""An in-place call with no capture rule of its own (``addcmul_``, ``addcdiv_``) on a strided view
of an input (``x[::2]``): capture runs its out-of-place form and compares its bits with the
in-place call's on the sample, and that comparison viewed the strided result as bytes, which
PyTorch cannot do (a RuntimeError out of capture, where eager runs the program). It compiles,
and answers as eager, on fresh inputs, several calls."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from tests.util import assert_bitwise


def _addcmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x[::2].addcmul_(y, y, value=0.5)
    return x * 2.0


def _addcdiv(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x[1::2].addcdiv_(y, y.abs() + 1.0)
    return x + 1.0


CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "addcmul": _addcmul,
    "addcdiv": _addcdiv,
}


@pytest.mark.parametrize("name", list(CASES))
def test_an_unruled_in_place_call_on_a_strided_view_compiles(name: str) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, fullgraph=True, options={"cache": False})
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x, y = torch.randn(6, generator=gen), torch.randn(3, generator=gen)
        got_x, want_x = x.clone(), x.clone()
        with torch.no_grad():
            got = compiled(got_x, y)
            want = fn(want_x, y)
        assert_bitwise(got, want, f"{name} call {seed}: output")
        assert_bitwise(got_x, want_x, f"{name} call {seed}: the input after the call")
    assert compiled.specializations[0].executor is not None

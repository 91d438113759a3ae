"""A bool tensor to a bool power stays bool, as in eager (``x ** True`` is ``x``, ``x ** False``
all True); to an integer power it is int64, as in eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait

CALLS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x ** True": lambda x: x**True,
    "x ** False": lambda x: x**False,
    "pow(x, True)": lambda x: torch.pow(x, True),
    "x.pow(False)": lambda x: x.pow(False),
    "x ** 2": lambda x: x**2,
    "in place x **= True": lambda x: x.clone().__ipow__(True),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_bool_tensor_to_a_power_matches_eager(name: str) -> None:
    f = CALLS[name]
    compiled = plait.compile(f, fullgraph=True, options={"cache": False})
    for seed in (1, 2, 3):
        x = torch.rand(5, 7, generator=torch.Generator().manual_seed(seed)) > 0.5
        want, got = f(x), compiled(x)
        assert got.dtype == want.dtype and torch.equal(got, want), (x, want, got)

"""A tensor the program reads that is neither an input, a parameter nor a buffer (a global, a
plain module attribute) keeps its identity when its type changes in place (``T.data = ...``,
``T.resize_()``, ``T.requires_grad_()``): its dtype, shape, strides, device and
``requires_grad`` are guarded, so the change recompiles and the results follow eager's (a size
or flag the program read of it was a stale literal of the graph; a graph fed a constant of
another type raised)."""

from __future__ import annotations

import torch
from torch import nn

import plait
from tests.util import assert_bitwise

NO_CACHE = {"cache": False}
TABLE = torch.randn(4)
SIZED = torch.randn(4)
FLAGGED = torch.randn(4)


def _added(x: torch.Tensor) -> torch.Tensor:
    return x + TABLE


def _sized(x: torch.Tensor) -> torch.Tensor:
    return x * SIZED.shape[0]


def _flagged(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 if FLAGGED.requires_grad else x - 1.0


def test_a_size_read_of_a_constant_follows_its_new_shape() -> None:
    saved = SIZED.data
    try:
        compiled = plait.compile(_sized, options=NO_CACHE)
        for n in (4, 5, 7):
            SIZED.data = torch.randn(n)
            x = torch.randn(3)
            assert_bitwise(compiled(x), _sized(x))
        assert len(compiled.specializations) == 3
    finally:
        SIZED.data = saved


def test_requires_grad_set_on_a_constant_recompiles() -> None:
    try:
        compiled = plait.compile(_flagged, options=NO_CACHE)
        x = torch.randn(4)
        assert_bitwise(compiled(x), _flagged(x))
        FLAGGED.requires_grad_(True)
        x = torch.randn(4)
        assert_bitwise(compiled(x), _flagged(x))
        assert len(compiled.specializations) == 2
    finally:
        FLAGGED.requires_grad_(False)


def test_a_constant_of_another_shape_or_dtype_recompiles() -> None:
    saved = TABLE.data
    try:
        compiled = plait.compile(_added, options=NO_CACHE)
        for new in (torch.randn(1), torch.randn(3, 4), torch.randn(4, dtype=torch.float64)):
            x = torch.randn(4)
            assert_bitwise(compiled(x), _added(x))
            TABLE.data = new
        x = torch.randn(4)
        got = compiled(x)
        assert got.dtype == torch.float64
        assert_bitwise(got, _added(x))
        TABLE.resize_(2, 1)
        x = torch.randn(4)
        assert_bitwise(compiled(x), _added(x))
    finally:
        TABLE.data = saved


def test_an_unchanged_constant_keeps_its_program() -> None:
    compiled = plait.compile(_added, options=NO_CACHE)
    for _ in range(3):
        TABLE.copy_(torch.randn(4))  # NOTE: values are read live: no recompile
        x = torch.randn(4)
        assert_bitwise(compiled(x), _added(x))
    assert len(compiled.specializations) == 1


class _Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mask = torch.randn(4)  # NOTE: a plain attribute, not a buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask


def test_a_module_attribute_tensor_of_another_shape_recompiles() -> None:
    m = _Masked()
    compiled = plait.compile(m, options=NO_CACHE)
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))
    m.mask.data = torch.randn(2, 4)
    x = torch.randn(4)
    got = compiled(x)
    assert got.shape == (2, 4)
    assert_bitwise(got, m(x))

"""Python attributes set on a tensor the program reads (``self.w.gain``, ``getattr(W, "scale",
1.0)``): capture runs on tracers, whose instance dicts are empty, so a parameter's attribute
raised AttributeError and a ``getattr`` default was baked into the graph; a global tensor's
attribute was a stale literal after a change. A parameter's, buffer's or constant's attribute
(present or absent) is now guarded by value, so a change recompiles, and so does a parameter or
buffer replaced by a new tensor (the guard watched the old one's attributes); an input tensor's
is the loud eager fallback (a new object on each call cannot be guarded), and one the input
lacked at capture (``getattr``'s default taken) is guarded absent on later calls."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise

NO_CACHE = {"cache": False}
SCALED = torch.randn(4)


class _Gained(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w * getattr(self.w, "gain", 1.0) + self.b * getattr(self.b, "bias", 0.0)


def test_attributes_of_parameters_and_buffers_are_read_and_guarded() -> None:
    m = _Gained()
    m.w.gain = 2.0  # type: ignore[attr-defined]
    compiled = plait.compile(m, options=NO_CACHE)
    for k in range(3):
        x = torch.randn(4)
        assert_bitwise(compiled(x), m(x))
        m.w.gain = 3.0 + k  # type: ignore[attr-defined]
        m.b.bias = 0.5 * k  # NOTE: absent at capture, set after
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))
    assert len(compiled.specializations) == 4


def test_a_parameter_attribute_read_without_a_default_is_found() -> None:
    class Direct(_Gained):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.w.gain

    m = Direct()
    m.w.gain = 2.5  # type: ignore[attr-defined]
    compiled = plait.compile(m, options=NO_CACHE)
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * SCALED * getattr(SCALED, "scale", 1.0)


def test_an_attribute_of_a_global_tensor_set_after_compiling_recompiles() -> None:
    try:
        compiled = plait.compile(_scaled, options=NO_CACHE)
        for k in range(3):
            x = torch.randn(4)
            assert_bitwise(compiled(x), _scaled(x))
            SCALED.scale = 2.0 + k  # type: ignore[attr-defined]
        x = torch.randn(4)
        assert_bitwise(compiled(x), _scaled(x))
        assert len(compiled.specializations) == 4
    finally:
        SCALED.__dict__.pop("scale", None)


def test_an_attribute_of_an_input_tensor_runs_eagerly_with_a_warning() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * getattr(x, "gain", 1.0)

    compiled = plait.compile(program, options=NO_CACHE)
    x = torch.randn(4)
    x.gain = 2.0  # type: ignore[attr-defined]
    with pytest.warns(CaptureFallbackWarning, match="gain"):
        assert_bitwise(compiled(x), program(x))
    x = torch.randn(4)
    x.gain = 3.0  # type: ignore[attr-defined]
    assert_bitwise(compiled(x), program(x))  # NOTE: the eager specialization, warned once
    plain = torch.randn(4)
    compiled = plait.compile(program, options=NO_CACHE)
    assert_bitwise(compiled(plain), program(plain))


def _scaled_input(x: torch.Tensor) -> torch.Tensor:
    return x * getattr(x, "scale", 1.0)


def test_an_input_attribute_absent_at_capture_and_set_later_is_eagers() -> None:
    """The capture took ``getattr``'s default (the input lacked ``scale``): a later input that
    holds it recompiles, and that capture is the loud eager fallback."""
    compiled = plait.compile(_scaled_input, options=NO_CACHE)
    x = torch.randn(4)
    assert_bitwise(compiled(x), _scaled_input(x))
    for scale in (2.0, 3.0):
        x = torch.randn(4)
        x.scale = scale  # type: ignore[attr-defined]
        with pytest.warns(CaptureFallbackWarning, match="scale") if scale == 2.0 else _quiet():
            assert_bitwise(compiled(x), _scaled_input(x))
    plain = torch.randn(4)
    assert_bitwise(compiled(plain), _scaled_input(plain))
    assert len(compiled.specializations) == 2


def test_an_input_attribute_read_through_hasattr_is_guarded() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if hasattr(x, "scale") else x * 3.0

    compiled = plait.compile(program, options=NO_CACHE)
    x = torch.randn(4)
    assert_bitwise(compiled(x), program(x))
    x = torch.randn(4)
    x.scale = None  # type: ignore[attr-defined]
    with pytest.warns(CaptureFallbackWarning, match="scale"):
        assert_bitwise(compiled(x), program(x))


def _quiet() -> Any:
    return contextlib.nullcontext()


@pytest.mark.parametrize("table", ["parameter", "buffer"])
def test_a_parameter_replaced_by_a_new_tensor_is_read_anew(table: str) -> None:
    """``m.w = nn.Parameter(...)`` (or a new buffer): the attribute the program reads is the new
    tensor's, whatever the one it replaced held."""
    m = _Gained()
    m.w.gain = 2.0  # type: ignore[attr-defined]
    m.b.bias = 0.5  # type: ignore[attr-defined]
    compiled = plait.compile(m, options=NO_CACHE)
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))
    for k in range(2):
        if table == "parameter":
            m.w = nn.Parameter(torch.randn(4))
            m.w.gain = 3.0 + k  # type: ignore[attr-defined]
        else:
            m.b = torch.randn(4)
            m.b.bias = 1.5 + k  # type: ignore[attr-defined]
        x = torch.randn(4)
        assert_bitwise(compiled(x), m(x))
    if table == "parameter":
        m.w.gain = 7.0  # type: ignore[attr-defined]  # NOTE: the new tensor's, changed in place
    else:
        m.b.bias = 7.0  # type: ignore[attr-defined]
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))

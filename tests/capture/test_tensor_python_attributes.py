"""Python attributes set on a tensor the program reads (``self.w.gain``, ``getattr(W, "scale",
1.0)``): capture runs on tracers, whose instance dicts are empty, so a parameter's attribute
raised AttributeError and a ``getattr`` default was baked into the graph; a global tensor's
attribute was a stale literal after a change. A parameter's, buffer's or constant's attribute
(present or absent) is now guarded by value, so a change recompiles; an input tensor's is the
loud eager fallback (a new object on each call cannot be guarded)."""

from __future__ import annotations

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

"""``vars(x)`` and ``x.__dict__`` of a tensor the program reads.

Capture runs the program on tracers, which kept plait's own fields (``_cx``, ``_lift``,
``_value`` ...) in their instance dicts: ``vars(x)`` of an input returned those thirteen entries
where eager returns the tensor's Python attributes, so ``len(vars(x))``, ``'foo' in vars(x)``
and ``x.__dict__['foo']`` were silently wrong, and a later call whose tensor holds other
attributes reused the graph. plait's fields are now slots, and the whole dict is read as an
attribute is (``plait.frontend.tensor_attrs``):

- an input's dict, empty at capture, is empty in the program and guarded empty (a later call's
  input that holds an attribute recompiles); one that holds attributes is the loud eager
  fallback (an argument's attributes cannot be guarded);
- a parameter's or buffer's is guarded by its contents (a change recompiles), and a write
  through it is the loud eager fallback (eager's would set the tensor's attribute);
- a tensor the program makes has its own dict, as in eager."""

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


def _counted(x: torch.Tensor) -> torch.Tensor:
    return x * (len(vars(x)) + 1.0)


def _flagged(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 if "foo" in vars(x) else x * 3.0


def _looked_up(x: torch.Tensor) -> torch.Tensor:
    return x * x.__dict__.get("foo", 1.5)


@pytest.mark.parametrize("program", [_counted, _flagged, _looked_up])
def test_an_input_dict_is_eagers_and_an_attribute_set_later_is_eagers_too(program: object) -> None:
    assert callable(program)
    compiled = plait.compile(program, options=NO_CACHE)
    for _ in range(2):
        x = torch.randn(4)
        assert_bitwise(compiled(x), program(x), "no attributes")
    assert compiled.specializations[0].fallback_reason is None
    x = torch.randn(4)
    x.foo = 4.0  # type: ignore[attr-defined]
    with pytest.warns(CaptureFallbackWarning, match="Python attributes of input x"):
        assert_bitwise(compiled(x), program(x), "an attribute: the guard fails, eager")
    x = torch.randn(4)
    x.bar = 5.0  # type: ignore[attr-defined]
    assert_bitwise(compiled(x), program(x), "another attribute")
    plain = torch.randn(4)
    assert_bitwise(compiled(plain), program(plain), "none again")
    assert len(compiled.specializations) == 2


def test_an_input_holding_attributes_at_capture_runs_eagerly_with_a_warning() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return x * x.__dict__["foo"] + len(vars(x))

    compiled = plait.compile(program, options=NO_CACHE)
    x = torch.randn(4)
    x.foo = 2.0  # type: ignore[attr-defined]
    with pytest.warns(CaptureFallbackWarning, match="'foo'"):
        assert_bitwise(compiled(x), program(x))
    x = torch.randn(4)
    x.foo = 3.0  # type: ignore[attr-defined]
    assert_bitwise(compiled(x), program(x))


def test_a_tensor_the_program_makes_has_its_own_dict() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        y.tag = 1.5  # type: ignore[attr-defined]
        z = y[1:]
        return z * len(vars(y)) * (len(z.__dict__) + 2) + vars(y)["tag"]

    compiled = plait.compile(program, fullgraph=True, options=NO_CACHE)
    for _ in range(3):
        x = torch.randn(4)
        assert_bitwise(compiled(x), program(x))


class _Tagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))
        self.register_buffer("b", torch.randn(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = vars(self.w).get("gain", 1.0) * (len(self.b.__dict__) + 1)
        return x * self.w * gain + self.b


def test_a_parameter_or_buffer_dict_is_guarded_by_its_contents() -> None:
    m = _Tagged()
    compiled = plait.compile(m, options=NO_CACHE)
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))
    m.w.gain = 2.0  # type: ignore[attr-defined]
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))
    m.b.note = "a"  # type: ignore[attr-defined]
    x = torch.randn(4)
    assert_bitwise(compiled(x), m(x))
    m.w.gain = 3.0  # type: ignore[attr-defined]
    for _ in range(2):
        x = torch.randn(4)
        assert_bitwise(compiled(x), m(x))
    assert len(compiled.specializations) == 4
    assert all(s.fallback_reason is None for s in compiled.specializations)


def test_a_write_through_a_parameter_dict_runs_eagerly_with_a_warning() -> None:
    class Writes(_Tagged):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            vars(self.w)["calls"] = vars(self.w).get("calls", 0) + 1
            return x * self.w.calls

    m = Writes()
    m.w.calls = 1  # type: ignore[attr-defined]
    compiled = plait.compile(m, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning, match="writes the Python attributes"):
        got = compiled(torch.ones(4))
    assert m.w.calls == 2  # type: ignore[attr-defined]  # NOTE: eager's write, once
    x = torch.randn(4)
    want = x * (m.w.calls + 1)  # type: ignore[attr-defined]
    assert_bitwise(got, torch.full((4,), 2.0))
    assert_bitwise(compiled(x), want)


def test_a_call_going_on_eagerly_reads_and_writes_the_callers_dict() -> None:
    """After a read of tensor data the call goes on eagerly (``frontend.continuation``): its
    ``vars(x)`` is the caller's tensor's own dict, as eager's, written once."""

    def program(x: torch.Tensor) -> torch.Tensor:
        scale = float(x.sum())
        attrs = vars(x)
        attrs["seen"] = attrs.get("seen", 0) + 1
        return x * scale * len(attrs)

    compiled = plait.compile(program, options=NO_CACHE)
    for held in ({"foo": 1.0}, {}):
        x = torch.randn(4)
        x.__dict__.update(held)
        twin = x.clone()
        twin.__dict__.update(held)
        with pytest.warns(CaptureFallbackWarning) if not compiled.specializations else _none():
            got = compiled(x)
        assert_bitwise(got, program(twin))
        assert vars(x) == vars(twin) == {**held, "seen": 1}


def _none() -> Any:
    return contextlib.nullcontext()


def test_a_parameter_dict_read_is_found_again_from_its_saved_form() -> None:
    """A warm start finds the root again by its description (``plait.frontend.saved_roots``)."""
    from plait.frontend.pyvalues import value_key
    from plait.frontend.saved_roots import resolve

    m = _Tagged()
    m.w.gain = 2.0  # type: ignore[attr-defined]
    root = resolve(["tensordict", "w"], m)
    before = value_key(root.read())
    m.w.gain = 3.0  # type: ignore[attr-defined]
    assert value_key(root.read()) != before
    assert root.show == "the attributes of w"

"""Python attributes a program sets on tensors are set by every compiled call, as eager sets them
(``plait.frontend.tensor_attr_writes``).

Capture runs the program on tracers, whose own dicts took the writes: ``x.seen = True`` on an
input, ``self.weight.flag = 1`` in a module's ``forward``, ``vars(x)["q"] = 3``, or ``y.tag =
"a"`` on a returned tensor were silently lost, on the call that captured and on every later
one. Each compiled call now sets the attributes the program leaves set on its input tensors, on
the module's parameters and buffers and on the tensors it returns. Each case runs in lockstep
with eager on fresh random inputs (a twin of each input, or a deep copy of the module): results
and the attributes of every object after the capture call and after later calls. What a compiled
call could not set again (a tensor or a list as the value, ``del x.attr``, ``x.__dict__ = ...``,
one tensor passed twice, a parameter's attribute read and changed) is the loud eager fallback,
with eager's state."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, ExportError
from tests.util import assert_bitwise, contract_tol

NO_CACHE = {"cache": False}
TOL = contract_tol("model", torch.float32)


def _same_attrs(got: Any, want: Any, what: str) -> None:
    """The Python attributes of two tensors are equal (tensors among them bit for bit)."""
    a, b = dict(vars(got)), dict(vars(want))
    assert a.keys() == b.keys(), f"{what}: {sorted(a)} != {sorted(b)}"
    for name, value in b.items():
        if isinstance(value, torch.Tensor):
            assert_bitwise(a[name], value, f"{what}.{name}")
        else:
            assert type(a[name]) is type(value) and a[name] == value, f"{what}.{name}"


def _same_results(got: Any, want: Any, what: str) -> None:
    """Equal results (tensors bit for bit, with their attributes), leaf by leaf."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            _same_results(g, w, f"{what}[{i}]")
        return
    assert_bitwise(got, want, what)
    _same_attrs(got, want, what)


def _twins(*attrs: tuple[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh random input and its eager twin, each holding ``attrs``."""
    x = torch.randn(5)
    twin = x.clone()
    for name, value in attrs:
        setattr(x, name, value)
        setattr(twin, name, value)
    return x, twin


def _marks_input(x: torch.Tensor) -> torch.Tensor:
    x.seen = True  # type: ignore[attr-defined]
    return x * 2


def _marks_through_vars(x: torch.Tensor) -> torch.Tensor:
    vars(x)["q"] = 3
    return x + 1


def _marks_through_dunder_dict(x: torch.Tensor) -> torch.Tensor:
    x.__dict__["r"] = (1, "a", None, 2.5)
    return x - 1


def _reads_its_own_write(x: torch.Tensor) -> torch.Tensor:
    x.n = 1  # type: ignore[attr-defined]
    return x * x.n  # type: ignore[attr-defined]


def _marks_what_eager_returns_as_the_input(x: torch.Tensor) -> torch.Tensor:
    y = x.contiguous()  # NOTE: eager returns x itself: the attribute is x's
    y.tag = "c"  # type: ignore[attr-defined]
    z = x.to(x.dtype)
    z.kind = torch.float16  # type: ignore[attr-defined]
    return x * 2


def _marks_output(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.tag = "a"  # type: ignore[attr-defined]
    y.where = x.device  # type: ignore[attr-defined]
    return y


def _marks_outputs_and_a_view(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    v = x[1:]
    v.tag = 3  # type: ignore[attr-defined]
    y = x + 1
    y.dtype_seen = torch.float64  # type: ignore[attr-defined]
    return v, y, x * 3


def _marks_the_input_it_returns(x: torch.Tensor) -> torch.Tensor:
    x.flag = 1.5  # type: ignore[attr-defined]
    return x


PROGRAMS = [
    _marks_input,
    _marks_through_vars,
    _marks_through_dunder_dict,
    _reads_its_own_write,
    _marks_what_eager_returns_as_the_input,
    _marks_output,
    _marks_outputs_and_a_view,
    _marks_the_input_it_returns,
]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_attributes_the_program_sets_are_set_by_every_compiled_call(
    program: Callable[..., Any],
) -> None:
    compiled = plait.compile(program, options=NO_CACHE)
    for call in range(4):
        x, twin = _twins()
        _same_results(compiled(x), program(twin), f"call {call}")
        _same_attrs(x, twin, f"call {call}: the input")
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].fallback_reason is None


@pytest.mark.parametrize(
    "program", [_marks_input, _reads_its_own_write, _marks_the_input_it_returns]
)
def test_an_attribute_the_input_holds_already_is_overwritten_as_in_eager(
    program: Callable[..., Any],
) -> None:
    compiled = plait.compile(program, options=NO_CACHE)
    for call in range(3):
        held = [("n", 5), ("seen", False), ("flag", "before"), ("other", 7)]
        x, twin = _twins() if call == 0 else _twins(*held)
        _same_results(compiled(x), program(twin), f"call {call}")
        _same_attrs(x, twin, f"call {call}: the input")
    assert len(compiled.specializations) == 1


def test_a_size_set_as_an_attribute_is_each_calls_size() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        x.seen_shape = x.shape  # type: ignore[attr-defined]
        x.rows = x.shape[0]  # type: ignore[attr-defined]
        return x + 1

    compiled = plait.compile(program, dynamic=True, options=NO_CACHE)
    for rows in (3, 5, 7, 5):
        x = torch.randn(rows, 2)
        twin = x.clone()
        _same_results(compiled(x), program(twin), f"{rows} rows")
        _same_attrs(x, twin, f"{rows} rows: the input")
        assert type(x.seen_shape) is torch.Size  # type: ignore[attr-defined]


class _Marked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("scale", torch.rand(3) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.flag = 1  # type: ignore[attr-defined]
        self.scale.seen = "yes"  # type: ignore[attr-defined]
        self.lin.bias.kind = torch.float32  # type: ignore[attr-defined]
        return self.lin(x) * self.scale


def _module_tensors(m: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*m.named_parameters(), *m.named_buffers()]


def test_a_module_sets_its_parameters_and_buffers_attributes_on_every_call() -> None:
    model = _Marked()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options=NO_CACHE)
    for call in range(4):
        if call == 2:  # NOTE: taken off between calls: the next call sets them again
            for m in (model, twin):
                del m.lin.weight.flag, m.scale.seen, m.lin.bias.kind
        if call == 3:  # NOTE: another value before the call: the call's is eager's
            for m in (model, twin):
                m.lin.weight.flag = 0
        x = torch.randn(2, 4)
        got, want = compiled(x), twin(x)
        torch.testing.assert_close(got, want, **TOL, msg=f"call {call}")
        for (name, a), (_, b) in zip(_module_tensors(model), _module_tensors(twin)):
            _same_attrs(a, b, f"call {call}: {name}")
    assert len(compiled.specializations) == 1
    assert compiled.specializations[0].fallback_reason is None


def test_an_input_attribute_read_before_it_is_set_recompiles_for_an_input_holding_it() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        x.n = getattr(x, "n", 0) + 1  # type: ignore[attr-defined]
        return x * x.n  # type: ignore[attr-defined]

    compiled = plait.compile(program, options=NO_CACHE)
    for call in range(3):  # NOTE: a new tensor each call: compiled
        x, twin = _twins()
        _same_results(compiled(x), program(twin), f"call {call}")
        _same_attrs(x, twin, f"call {call}: the input")
    assert len(compiled.specializations) == 1
    with pytest.warns(CaptureFallbackWarning, match="'n'"):  # NOTE: x holds n now: eager's 2
        _same_results(compiled(x), program(twin), "the same tensor again")
    _same_attrs(x, twin, "the same tensor again")
    assert x.n == 2  # type: ignore[attr-defined]


def test_a_parameter_attribute_read_and_changed_runs_eagerly_with_a_warning() -> None:
    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.w.calls = getattr(self.w, "calls", 0) + 1  # type: ignore[attr-defined]
            return x * self.w

    model = Counting()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options=NO_CACHE)
    for call in range(3):
        x = torch.randn(5)
        if call == 0:
            with pytest.warns(CaptureFallbackWarning, match="changes the Python attribute 'calls'"):
                got = compiled(x)
        else:
            got = compiled(x)
        torch.testing.assert_close(got, twin(x), **TOL, msg=f"call {call}")
        _same_attrs(model.w, twin.w, f"call {call}")
    assert model.w.calls == 3  # type: ignore[attr-defined]


def _sets_a_tensor(x: torch.Tensor) -> torch.Tensor:
    x.double = x * 2  # type: ignore[attr-defined]
    return x + 1


def _sets_a_list(x: torch.Tensor) -> torch.Tensor:
    x.meta = [1, 2]  # type: ignore[attr-defined]
    return x + 1


def _deletes(x: torch.Tensor) -> torch.Tensor:
    del x.tag  # type: ignore[attr-defined]
    return x + 1


def _deletes_its_own_write(x: torch.Tensor) -> torch.Tensor:
    x.tag = 2  # type: ignore[attr-defined]
    del x.tag  # type: ignore[attr-defined]
    return x + 1


def _replaces_the_dict(x: torch.Tensor) -> torch.Tensor:
    x.__dict__ = {"a": 1}
    return x + 1


def _deletes_through_what_eager_returns_as_the_input(x: torch.Tensor) -> torch.Tensor:
    del x.float().tag  # type: ignore[attr-defined]
    return x * 2


REFUSED = [
    (_sets_a_tensor, "'double'"),
    (_sets_a_list, "'meta'"),
    (_deletes, "deletes the Python attribute 'tag'"),
    (_deletes_its_own_write, "deletes the Python attribute 'tag'"),
    (_replaces_the_dict, "replaces the Python attributes"),
    (_deletes_through_what_eager_returns_as_the_input, "deletes the Python attribute 'tag'"),
]


@pytest.mark.parametrize(("program", "why"), REFUSED, ids=lambda p: getattr(p, "__name__", ""))
def test_what_a_compiled_call_cannot_set_again_runs_eagerly_with_a_warning(
    program: Callable[..., Any], why: str
) -> None:
    compiled = plait.compile(program, options=NO_CACHE)
    for call in range(3):
        x, twin = _twins(("tag", 1), ("keep", "k"))
        if call == 0:
            with pytest.warns(CaptureFallbackWarning, match=why):
                got = compiled(x)
        else:
            got = compiled(x)
        _same_results(got, program(twin), f"call {call}")
        _same_attrs(x, twin, f"call {call}: the input")


def test_one_tensor_passed_twice_to_a_program_setting_its_attribute_matches_eager() -> None:
    """``f(x, x)`` is one tensor under capture: the attribute set through ``a`` is read
    through ``b``, as in eager, compiled (another specialization than ``f(x, y)``)."""

    def program(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.tag = 2  # type: ignore[attr-defined]
        return b * getattr(b, "tag", 1)

    compiled = plait.compile(program, options=NO_CACHE)
    x, twin = _twins()
    y, y_twin = _twins()
    _same_results(compiled(x, y), program(twin, y_twin), "two tensors")
    _same_attrs(x, twin, "two tensors: a")
    _same_attrs(y, y_twin, "two tensors: b")
    x, twin = _twins()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        got = compiled(x, x)
    _same_results(got, program(twin, twin), "one tensor twice")
    _same_attrs(x, twin, "one tensor twice")
    assert x.tag == 2  # type: ignore[attr-defined]
    assert len(compiled.specializations) == 2
    assert not any(spec.fallback_reason for spec in compiled.specializations)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_attributes_set_before_a_refused_data_read_are_the_callers(grad: bool) -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        x.seen = 1  # type: ignore[attr-defined]
        y = x * 2
        y.tag = "t"  # type: ignore[attr-defined]
        if y.sum() > -1e9:  # NOTE: a read of tensor data: the call goes on eagerly
            x.after = 2  # type: ignore[attr-defined]
            del y.tag  # type: ignore[attr-defined]
            y.tag = "u"  # type: ignore[attr-defined]
        return y

    compiled = plait.compile(program, options=NO_CACHE)
    for call in range(3):
        x, twin = _twins()
        with torch.set_grad_enabled(grad):
            if call == 0:
                with pytest.warns(CaptureFallbackWarning, match="Tensor.__bool__"):
                    got = compiled(x)
            else:
                got = compiled(x)
            want = program(twin)
        _same_results(got, want, f"call {call}")
        _same_attrs(x, twin, f"call {call}: the input")


def test_an_export_of_a_program_setting_attributes_is_refused() -> None:
    with pytest.raises(ExportError, match="Python attributes"):
        plait.export(_marks_input, (torch.randn(5),))


def test_a_parameter_attribute_set_through_its_dict_runs_eagerly_with_a_warning() -> None:
    class ThroughVars(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            vars(self.w)["kind"] = "scaled"
            return x * self.w

    model = ThroughVars()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options=NO_CACHE)
    for call in range(3):
        x = torch.randn(5)
        if call == 0:
            with pytest.warns(CaptureFallbackWarning, match="'kind'"):
                got = compiled(x)
        else:
            got = compiled(x)
        torch.testing.assert_close(got, twin(x), **TOL, msg=f"call {call}")
        _same_attrs(model.w, twin.w, f"call {call}")


def test_regions_of_a_module_that_runs_eagerly_set_their_attributes() -> None:
    class Sub(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.lin.weight.flag = "set"  # type: ignore[attr-defined]
            y = self.lin(x)
            y.made_by = "sub"  # type: ignore[attr-defined]
            return y

    class Top(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = Sub(), Sub()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.a(x)
            return self.b(y) if y.sum() > -1e9 else y  # NOTE: a data read: regions

    model = Top()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options=NO_CACHE)
    for call in range(3):
        x = torch.randn(2, 3)
        if call == 0:
            with pytest.warns(CaptureFallbackWarning, match="Tensor.__bool__"):
                got = compiled(x)
        else:
            got = compiled(x)
        want = twin(x)
        torch.testing.assert_close(got, want, **TOL, msg=f"call {call}")
        _same_attrs(got, want, f"call {call}: the result")
        for (name, a), (_, b) in zip(_module_tensors(model), _module_tensors(twin)):
            _same_attrs(a, b, f"call {call}: {name}")
        for m in (model, twin):
            del m.a.lin.weight.flag, m.b.lin.weight.flag


CALLS: list[int] = []


def test_the_call_refused_after_its_program_ran_sets_the_attributes_once() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        CALLS.append(1)  # NOTE: a Python value it reads and changes: refused after it ran
        x.seen = len(CALLS)  # type: ignore[attr-defined]
        return x * 2

    compiled = plait.compile(program, options=NO_CACHE)
    for call in range(3):
        x, twin = _twins()
        if call == 0:
            with pytest.warns(CaptureFallbackWarning, match="changes Python values"):
                got = compiled(x)
        else:
            got = compiled(x)
        assert x.seen == len(CALLS)  # type: ignore[attr-defined]
        del CALLS[-1]  # NOTE: the twin's call appends again
        _same_results(got, program(twin), f"call {call}")
        _same_attrs(x, twin, f"call {call}: the input")

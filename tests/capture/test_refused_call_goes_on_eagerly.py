"""A compiled function whose capture is refused while it runs (a read of tensor data) goes on
eagerly from the refusal (``plait.frontend.continuation``; docs/capture.md, "A refusal while
the program runs"): the Python before the refusal runs once, the call returns eager's result,
writes land in the caller's tensors and in the module's buffers (tensor constants of the
function) once, and no tracer stays behind. Each function calls a module it closes over and
runs in lockstep with an eager twin (a deep copy) on fresh random inputs (with grad mode on
too). Beside them, the cases that keep the eager run from the start: ``fullgraph=True`` (the
refusal raises), ``capture_program`` without continuation, and a compiled module (its fallback
runs regions)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from plait.frontend import capture_program
from plait.frontend.capture_values import Tracer
from tests.capture.lockstep import TOL, inputs, lockstep


def _tracers(x: Any, seen: set[int] | None = None, depth: int = 0) -> list[str]:
    """Where a tracer is reachable from ``x`` (containers, attributes, module tables)."""
    seen = set() if seen is None else seen
    if isinstance(x, Tracer):
        return ["here"]
    if id(x) in seen or depth > 20 or isinstance(x, (torch.Tensor, str, type)):
        return []
    seen.add(id(x))
    items: list[tuple[str, Any]] = []
    if isinstance(x, (list, tuple, set)):
        items = [(f"[{i}]", v) for i, v in enumerate(x)]
    elif isinstance(x, dict):
        items = [(f"[{k!r}]", v) for k, v in x.items()]
    items += [(f".{k}", v) for k, v in getattr(x, "__dict__", {}).items()]
    return [f"{k}{w}" for k, v in items for w in _tracers(v, seen, depth + 1)]


class Logged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.log: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(x.shape[0])
        y = self.lin(x)
        return y * 2 if bool(y.sum() > 0) else y - 1


def test_a_list_appended_before_the_refusal_gets_one_entry_per_call() -> None:
    torch.manual_seed(0)

    def same_log(model: nn.Module, twin: nn.Module) -> None:
        assert model.log == twin.log

    lockstep(Logged().eval(), same_log, seed=3, rows=3, as_function=True)


STEPS = 0


class GlobalSteps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global STEPS
        STEPS += 1
        y = self.lin(x)
        return y + STEPS if bool(y.mean() > 0) else y - STEPS


def test_a_global_counter_stepped_before_the_refusal_steps_once_per_call() -> None:
    global STEPS
    torch.manual_seed(0)
    model = GlobalSteps().eval()
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    STEPS = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for step, x in enumerate(inputs(4, seed=1, rows=3), start=1):
            got = compiled(x)
            assert step == STEPS
            y = model.lin(x)
            want = y + step if bool(y.mean() > 0) else y - step
            torch.testing.assert_close(got, want, **TOL)


class RunningTotal(nn.Module):
    """Writes a buffer and its input in place before it reads tensor data."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("total", torch.zeros(4))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.total.add_(x.sum(0))
        x.mul_(0.5)
        y = self.lin(x) + self.total
        if bool(y.sum() > 0):
            self.total.mul_(0.9)
        return y * self.calls


def test_buffer_and_input_writes_before_the_refusal_are_made_once() -> None:
    torch.manual_seed(0)
    model = RunningTotal().eval()
    twin = copy.deepcopy(model)
    buffer = model.total
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for x in inputs(4, seed=2, rows=3):
            mine, theirs = x.clone(), x.clone()
            torch.testing.assert_close(compiled(mine), twin(theirs), **TOL)
            torch.testing.assert_close(mine, theirs, **TOL)
            torch.testing.assert_close(model.total, twin.total, **TOL)
            assert model.calls == twin.calls
    assert model.total is buffer


class Keeps(nn.Module):
    """Keeps tensors made before the refusal on itself and in what it returns."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.history: list[torch.Tensor] = []
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        y = self.lin(x)
        self.history.append(y)
        self.last = y
        sign = 1.0 if bool(y.sum() > 0) else -1.0
        return {"y": y * sign, "parts": (y, x.shape[0]), "view": x[1:]}


def test_no_tracer_stays_in_the_result_or_the_module() -> None:
    torch.manual_seed(0)
    model = Keeps().eval()
    twin = copy.deepcopy(model)
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    x = torch.randn(3, 4)
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning, match="reads tensor data"):
        got = compiled(x)
    with torch.no_grad():
        want = twin(x)
    assert _tracers(got) == [] and _tracers(model) == []
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(model.history, twin.history, **TOL)
    assert model.last is model.history[0]
    assert got["view"].data_ptr() == x[1:].data_ptr()  # NOTE: a view of the caller's tensor
    assert type(got["parts"][1]) is int


class CountsThenReads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.lin(x)
        return y * self.calls if bool(y.sum() > 0) else y


class CountsThenBranches(CountsThenReads):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.lin(x)
        return y * 2 if bool(y.sum() > 0) else y


def test_with_grad_mode_on_the_call_goes_on_with_eagers_history() -> None:
    """Grad mode on: the program's calls before the refusal are made again on the caller's
    tensors with grad (plait.frontend.grad_replay), so the call goes on with eager's history:
    the Python before the refusal runs once, values and gradients are eager's."""
    torch.manual_seed(0)
    model = CountsThenBranches().train()
    twin = copy.deepcopy(model)
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for x in inputs(3, seed=4, rows=3):
            got, want = compiled(x), twin(x)
            torch.testing.assert_close(got, want, **TOL)
            got.square().sum().backward()
            want.square().sum().backward()
            assert model.calls == twin.calls
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_fullgraph_raises_at_the_read() -> None:
    model = CountsThenReads().eval()
    compiled = plait.compile(lambda x: model(x), fullgraph=True, options={"cache": False})
    with torch.no_grad(), pytest.raises(GraphCaptureError) as info:
        compiled(torch.randn(2, 4))
    assert info.value.lineno == CountsThenReads.forward.__code__.co_firstlineno + 3
    assert "Tensor.__bool__" in str(info.value)


def test_capture_alone_never_writes_the_callers_tensors() -> None:
    """``capture_program`` (and ``plait.capture``) without continuation: the eager fallback,
    the caller's input and buffer untouched."""
    model = RunningTotal().eval()
    x = torch.randn(3, 4)
    before_x, before_total = x.clone(), model.total.clone()
    with torch.no_grad():
        prog = capture_program(model, (x,), fullgraph=False)
    assert prog.graph is None and prog.this_call is None
    assert torch.equal(x, before_x) and torch.equal(model.total, before_total)
    assert model.calls == 1


class CountsThenSorts(CountsThenReads):
    """``sort`` reads what capture left uncomputed (``linear``): computed then (late_values)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.sort(self.lin(x), dim=1).values * self.calls


@pytest.mark.parametrize("model", [CountsThenReads, CountsThenSorts], ids=["reads", "sorts"])
def test_a_counter_counts_each_call_once(model: type[nn.Module]) -> None:
    torch.manual_seed(0)

    def same_count(m: nn.Module, twin: nn.Module) -> None:
        assert m.calls == twin.calls

    lockstep(model().eval(), same_count, seed=3, rows=3, as_function=True)


def test_a_compiled_module_counts_each_call_once() -> None:
    torch.manual_seed(0)
    model = CountsThenReads().eval()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for x in inputs(3, seed=6, rows=3):
            torch.testing.assert_close(compiled(x), twin(x), **TOL)
            assert model.calls == twin.calls


class WritesThroughData(CountsThenReads):
    """Writes its input through ``.data`` (its own version counter) after a linear capture left
    uncomputed, then reads the linear's result: computed on the input as the linear read it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.lin(x)
        x.data.mul_(3)
        return y * 2 if bool(y.sum() > 0) else y - x


def test_a_write_through_data_after_a_skipped_call_keeps_the_value_it_read() -> None:
    torch.manual_seed(0)
    model = WritesThroughData().eval()
    twin = copy.deepcopy(model)
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for x in inputs(3, seed=5, rows=3):
            mine, theirs = x.clone(), x.clone()
            torch.testing.assert_close(compiled(mine), twin(theirs), **TOL)
            torch.testing.assert_close(mine, theirs, **TOL)


class ReadsItsBuffer(nn.Module):
    """Called with a view of its own buffer, which it writes before it reads the buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.arange(4.0))
        self.calls = 0

    def forward(self, part: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        part.add_(1)
        y = self.total * 3
        if bool(y.sum() > 0):
            self.total.mul_(2)
        return y


def test_an_input_that_views_a_buffer_it_writes_reads_the_write() -> None:
    """The samples of the input and the buffer are copies of their own: the call runs eagerly
    from the start (its Python before the refusal twice), as the alias guard would have it."""
    model = ReadsItsBuffer().eval()
    twin = copy.deepcopy(model)
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for _ in range(3):
            torch.testing.assert_close(compiled(model.total[:2]), twin(twin.total[:2]), **TOL)
            torch.testing.assert_close(model.total, twin.total, **TOL)


def _adds_then_branches(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(10)
    return b * 2 if bool(b.sum() > 0) else b * 0


@pytest.mark.parametrize("view", [False, True], ids=["same-tensor", "view-and-base"])
def test_a_write_to_an_input_is_read_through_another_that_shares_its_memory(view: bool) -> None:
    compiled = plait.compile(_adds_then_branches, options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for _ in range(3):
            mine, theirs = -torch.ones(2, 4), -torch.ones(2, 4)
            got = compiled(mine[0] if view else mine, mine)
            want = _adds_then_branches(theirs[0] if view else theirs, theirs)
            torch.testing.assert_close(got, want, **TOL)
            torch.testing.assert_close(mine, theirs, **TOL)

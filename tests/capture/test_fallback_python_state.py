"""The call whose capture is refused only after the program's Python ran to its end (it changes
Python values it reads) runs its captured graph instead of the Python again
(``plait.frontend.refused_after_run``; docs/capture.md, "Known limitation"): its Python side
effects happen once, as in eager, and later calls run eagerly. Each model runs in lockstep with
an eager twin on fresh inputs. Beside them, the case that rules out putting back what the
capture changed (an install-once flag whose hooks stay installed), a program that stores one of
its tensors (the eager run stands), and a compiled module refused while it runs, its counter
counted once: the call goes on eagerly from the refusal, and a read of values capture left
uncomputed computes them instead of running the Python again
(``tests/capture/test_refused_call_goes_on_eagerly.py``)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.capture.lockstep import TOL, inputs, lockstep


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


def test_a_refused_counter_counts_each_call_once() -> None:
    torch.manual_seed(0)

    def same_count(model: nn.Module, twin: nn.Module) -> None:
        assert model.calls == twin.calls

    lockstep(Counter().eval(), same_count)


def test_the_call_that_captured_warns_and_later_calls_run_eagerly() -> None:
    torch.manual_seed(0)
    model = Counter().eval()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad(), pytest.warns(CaptureFallbackWarning, match=r"self\.calls"):
        compiled(torch.randn(2, 4))
    assert model.calls == 1
    assert not compiled.specializations[0].program.has_graph
    assert compiled.specializations[0].program.this_call is None  # NOTE: taken by that call


class Logged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.log: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(x.shape[0])
        return self.lin(x).relu()


def test_a_refused_list_log_gets_one_entry_per_call() -> None:
    torch.manual_seed(0)

    def same_log(model: nn.Module, twin: nn.Module) -> None:
        assert model.log == twin.log

    lockstep(Logged().eval(), same_log)


STEPS = 0


class GlobalCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global STEPS
        STEPS += 1
        return self.lin(x) + STEPS


def test_a_refused_global_counter_steps_once_per_call() -> None:
    global STEPS
    torch.manual_seed(0)
    model = GlobalCounter().eval()
    compiled = plait.compile(model, options={"cache": False})
    STEPS = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for step, x in enumerate(inputs(4, seed=1), start=1):
            got = compiled(x)
            assert step == STEPS
            torch.testing.assert_close(got, model.lin(x) + step, **TOL)


class CountedStatistics(nn.Module):
    """A buffer written in place (a running sum) beside a Python counter."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("total", torch.zeros(4))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.total.add_(x.sum(0))
        return self.lin(x) * self.calls + self.total


def test_a_buffer_written_in_place_is_written_once_by_the_refused_call() -> None:
    torch.manual_seed(0)

    def same_state(model: nn.Module, twin: nn.Module) -> None:
        assert model.calls == twin.calls
        torch.testing.assert_close(model.total, twin.total, **TOL)

    lockstep(CountedStatistics().eval(), same_state)


class CountsIntoCache(Counter):
    def forward(self, x: torch.Tensor, cache: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        y = self.lin(x)
        cache["k"] = y * 2
        return y * self.calls


def test_an_input_dict_the_refused_call_fills_is_the_callers() -> None:
    """The refused call's write into its input dict is made in the caller's dict, once."""
    torch.manual_seed(0)
    model = CountsIntoCache().eval()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for x in inputs(3, seed=5):
            got_cache: dict[str, torch.Tensor] = {}
            want_cache: dict[str, torch.Tensor] = {}
            torch.testing.assert_close(compiled(x, got_cache), twin(x, want_cache), **TOL)
            torch.testing.assert_close(got_cache, want_cache, **TOL)
            assert model.calls == twin.calls


class TrainingCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.5)
        self.bn = nn.BatchNorm1d(8)
        self.steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return self.bn(self.drop(self.lin(x))) * self.steps


def test_a_refused_training_call_with_grad_matches_eager() -> None:
    """Training mode with gradients: dropout's draws, the batch norm's running statistics and
    the gradients of the call that captured are eager's, and the counter counts once."""
    torch.manual_seed(0)
    model = TrainingCounter().train()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for k, x in enumerate(inputs(3, seed=4, rows=6)):
            torch.manual_seed(100 + k)
            got = compiled(x)
            torch.manual_seed(100 + k)
            want = twin(x)
            torch.testing.assert_close(got, want, **TOL)
            got.square().sum().backward()
            want.square().sum().backward()
            assert model.steps == twin.steps == k + 1
            for (name, p), q in zip(model.named_parameters(), twin.parameters()):
                torch.testing.assert_close(p.grad, q.grad, **TOL, msg=name)
            for (name, b), c in zip(model.named_buffers(), twin.buffers()):
                torch.testing.assert_close(b, c, **TOL, msg=name)


class Parent(nn.Module):
    """Refused while it runs (a read of tensor data), before it calls its counting child: its
    regions compile the child, whose own capture is refused after it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.child = Counter()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            x = x * 2
        return self.child(x)


def test_a_refused_region_counts_each_call_once() -> None:
    torch.manual_seed(0)

    def same_count(model: nn.Module, twin: nn.Module) -> None:
        assert model.child.calls == twin.child.calls

    lockstep(Parent().eval(), same_count)


def test_fullgraph_raises_at_the_line_that_changes_the_value() -> None:
    model = Counter().eval()
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    with torch.no_grad(), pytest.raises(GraphCaptureError) as info:
        compiled(torch.randn(2, 4))
    assert info.value.lineno == Counter.forward.__code__.co_firstlineno + 1
    assert "self.calls" in str(info.value)


class OutputLog(nn.Module):
    """Stores its output in a list it reads: the capture's tensor is put back, and that call
    runs eagerly (running the graph would leave the list without it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.outs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.outs.append(y)
        return y * 2


def test_a_refused_program_that_stores_its_tensor_runs_eagerly_once() -> None:
    torch.manual_seed(0)

    def same_log(model: nn.Module, twin: nn.Module) -> None:
        assert len(model.outs) == len(twin.outs)
        torch.testing.assert_close(model.outs[-1], twin.outs[-1], **TOL)

    lockstep(OutputLog().eval(), same_log)


class CountsThenReads(Counter):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.lin(x)
        return y * self.calls if bool(y.sum() > 0) else y


def test_a_counter_refused_while_it_runs_counts_each_call_once() -> None:
    torch.manual_seed(0)

    def same_count(model: nn.Module, twin: nn.Module) -> None:
        assert model.calls == twin.calls

    lockstep(CountsThenReads().eval(), same_count)


class CountsThenSorts(Counter):
    """A call that reads values (``sort``) after one capture leaves uncomputed (``linear``):
    capture runs the program again computing every call (a resample)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.sort(self.lin(x), dim=1).values * self.calls


def test_a_resampled_refused_counter_counts_each_call_once() -> None:
    torch.manual_seed(0)

    def same_count(model: nn.Module, twin: nn.Module) -> None:
        assert model.calls == twin.calls

    lockstep(CountsThenSorts().eval(), same_count)


class HookedOnce(nn.Module):
    """Installs a forward hook on its child the first time it runs (a flag guards it), as
    transformers' output recording does, then reads tensor data (the capture falls back)."""

    def __init__(self) -> None:
        super().__init__()
        self.child = nn.Linear(4, 4)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(self, "_hooked", False):
            self.child.register_forward_hook(lambda m, a, out: self.seen.append(out))
            self._hooked = True
        self.seen.clear()
        y = self.child(x)
        return y * 2 if bool(y.sum() > 0) else y


def test_an_install_once_hook_records_each_output_once() -> None:
    """Putting back what the capture changed would put back the flag while the hook stays
    installed: the eager run would install it again, and each output would be recorded
    twice."""
    torch.manual_seed(2)

    def one_record(model: nn.Module, twin: nn.Module) -> None:
        assert len(model.seen) == len(twin.seen) == 1
        torch.testing.assert_close(model.seen[0], twin.seen[0], **TOL)

    lockstep(HookedOnce().eval(), one_record, calls=3)

"""In-place ops, views and writes through views become pure IR; mutated inputs, buffers and
captured constants are written back after each call, matching eager bitwise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import GraphCaptureError
from tests.capture.helpers import assert_same


def _check(fn: Callable[..., Any], *shapes: tuple[int, ...], calls: int = 2) -> Any:
    """Run ``fn`` compiled (fullgraph) and eagerly on equal copies of fresh inputs; outputs and
    the (possibly mutated) inputs must match bitwise."""
    compiled = plait.compile(fn, backend="eager", fullgraph=True)
    for i in range(calls):
        g = torch.Generator().manual_seed(i)
        inputs = [torch.randn(*s, generator=g) for s in shapes]
        mine = [t.clone() for t in inputs]
        theirs = [t.clone() for t in inputs]
        assert_same(compiled(*mine), fn(*theirs))
        assert_same(mine, theirs, "inputs after the call")
    assert len(compiled.specializations) == 1
    return compiled


def _inplace_input(x: torch.Tensor) -> torch.Tensor:
    x.add_(1.0)
    x.mul_(2)
    return x.relu_()


def test_inplace_on_input_is_written_back_and_returned_as_itself() -> None:
    compiled = _check(_inplace_input, (3, 4))
    x = torch.randn(3, 4)
    assert compiled(x) is x
    ops = [n.op for n in compiled.specializations[0].graph.nodes]
    assert ops == ["add", "mul", "relu"]


def _through_view(x: torch.Tensor) -> torch.Tensor:
    y = x.view(-1)
    y.mul_(3)
    x.t()[0].add_(1)
    return y.sum()


def _view_after_base_write(x: torch.Tensor) -> torch.Tensor:
    row = x[1]
    col = x[:, 2]
    x.mul_(2)
    return row + 1, col * 1  # type: ignore[return-value]


def _setitem(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, 1] = 5.0
    y[0] = torch.arange(4.0)
    y[..., -1] = y[..., 0]
    y[1:3, None, 2:] = 7
    return y


def _masked_setitem(x: torch.Tensor) -> torch.Tensor:
    x[x < 0] = 0.0
    return x * 2


def _split_views(x: torch.Tensor) -> torch.Tensor:
    _, b = x.split([1, 3], dim=1)
    b.add_(10)
    _, d = x.chunk(2, dim=0)
    d.zero_()
    for row in x.unbind(0):
        row.mul_(2)
    return x.sum(dim=0)


def _copy_fill(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x[:2].copy_(y[:2])
    x[2].fill_(-1)
    y.clamp_(-0.5, 0.5)
    y.masked_fill_(y > 0.4, 0.0)
    return x + y


def _functional_inplace(x: torch.Tensor) -> torch.Tensor:
    h = F.relu(x, inplace=True)
    h = F.dropout(h, 0.5, training=False, inplace=True)
    return F.silu(h, inplace=True)


@pytest.mark.parametrize(
    "fn",
    [
        _through_view,
        _view_after_base_write,
        _setitem,
        _masked_setitem,
        _split_views,
        _functional_inplace,
    ],
)
def test_views_and_writes(fn: Callable[..., Any]) -> None:
    _check(fn, (3, 4))


def test_copy_fill_clamp_masked_fill() -> None:
    _check(_copy_fill, (3, 4), (3, 4))


def test_clone_output_never_aliases_input() -> None:
    compiled = plait.compile(lambda x: (x.clone(), x), fullgraph=True, backend="eager")
    x = torch.randn(3)
    a, b = compiled(x)
    assert b is x and a is not x and torch.equal(a, x)


class _Counter(torch.nn.Module):
    count: torch.Tensor
    total: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        self.total.add_(x.sum(0))
        return x * self.count


def test_module_buffers_written_back_each_call() -> None:
    model = _Counter()
    compiled = plait.compile(model, backend="eager", fullgraph=True)
    ref = _Counter()
    for _ in range(3):
        x = torch.randn(2, 3)
        assert torch.equal(compiled(x), ref(x))
    assert int(model.count) == 3
    assert torch.equal(model.total, ref.total)
    assert len(compiled.specializations) == 1


def test_captured_constant_written_back() -> None:
    state = torch.zeros(3)

    def f(x: torch.Tensor) -> torch.Tensor:
        state.add_(x)
        return state * 2

    compiled = plait.compile(f, backend="eager", fullgraph=True)
    for _ in range(3):
        compiled(torch.ones(3))
    assert torch.equal(state, torch.full((3,), 3.0))


def test_inplace_on_parameter_is_refused() -> None:
    model = torch.nn.Linear(2, 2)

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.lin.weight.mul_(2)
            return self.lin(x)

    before = model.weight.detach().clone()
    with pytest.raises(GraphCaptureError, match=r"in-place update of parameter 'lin\.weight'"):
        plait.capture(M(), (torch.randn(1, 2),))
    assert torch.equal(model.weight, before)


def test_inplace_on_leaf_requiring_grad_fails_like_eager() -> None:
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        plait.capture(lambda x: x.add_(1), (torch.randn(2, requires_grad=True),))


def test_write_through_strided_slice_matches_eager() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x[::2] = 0.0
        return x

    compiled = plait.compile(f, fullgraph=True)
    for seed in (0, 1):
        x = torch.randn(5, generator=torch.Generator().manual_seed(seed))
        ours, theirs = x.clone(), x.clone()
        assert torch.equal(compiled(ours), f(theirs)) and torch.equal(ours, theirs)


def test_mutated_inputs_may_not_alias() -> None:
    """A view of a written input is another tensor sharing its memory: refused. (The same
    tensor passed twice is one tensor: tests/capture/test_state_and_held_tensors_as_inputs.py.)"""
    x = torch.randn(4)
    with pytest.raises(GraphCaptureError, match="shares memory"):
        plait.capture(lambda a, b: a.add_(b), (x, x.view(4)))

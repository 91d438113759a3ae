"""``Tensor.detach``, ``torch.detach`` and reading ``Tensor.data`` become the IR's ``detach`` op:
same values (bitwise equal to eager on fresh inputs), memory shared with the source (writes
through it reach the source, and it sees the source's later writes), and a result that never
requires grad. Writing ``.data`` and ``detach_()`` are clear capture errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.capture.helpers import assert_same


def _check(fn: Any, shape: tuple[int, ...] = (3, 4), calls: int = 2, **kw: Any) -> Any:
    compiled = plait.compile(fn, backend="eager", fullgraph=True, **kw)
    for i in range(calls):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(*shape, generator=g)
        assert_same(compiled(x.clone()), fn(x.clone()), f"call {i}")
    assert len(compiled.specializations) == 1
    spec = compiled.specializations[0]
    assert spec.opaque_counts == {}
    return spec


def test_detach_spellings_are_the_detach_op() -> None:
    spec = _check(lambda x: (x.detach() * 2, torch.detach(x) + 1, x.data.exp(), x.detach().t()))
    assert [n.op for n in spec.graph.nodes].count("detach") == 4


def test_detach_result_never_requires_grad() -> None:
    def f(x: torch.Tensor) -> Any:
        return x.detach(), (x * 3).detach() + x, x.data.requires_grad

    compiled = plait.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(4, requires_grad=True)
    got, want = compiled(x), f(x)
    assert_same(got[:2], want[:2])
    assert got[2] is False and not got[0].requires_grad and got[1].requires_grad
    (gx,) = torch.autograd.grad(got[1].sum(), x)
    (ex,) = torch.autograd.grad(want[1].sum(), x)
    assert_same(gx, ex, "gradient")  # NOTE: 1, not 4: nothing flows through detach


def test_writes_through_detach_reach_the_source() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.detach().mul_(2)
        y.data[0] = 7.0
        return y

    _check(f)


def test_detach_sees_later_writes_to_its_source() -> None:
    def f(x: torch.Tensor) -> Any:
        y = x.clone()
        d, e = y.detach(), y.data[1:]
        y.add_(1)
        return d * 2, e.sum()

    _check(f)


def test_writing_an_input_through_data_writes_it_back() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.data.clamp_(-0.5, 0.5)
        return x + 1

    compiled = plait.compile(f, backend="eager", fullgraph=True)
    for i in range(2):
        x = torch.randn(5, generator=torch.Generator().manual_seed(i))
        x_eager = x.clone()
        assert_same(compiled(x), f(x_eager))
        assert_same(x, x_eager, "input after the call")


def test_write_through_detach_of_a_tensor_requiring_grad_is_refused() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        x.detach().zero_()
        return x * 2

    with pytest.raises(GraphCaptureError, match=r"through detach\(\)/\.data") as info:
        plait.capture(f, (torch.randn(3, requires_grad=True),))
    assert info.value.kind == "limitation"
    with torch.no_grad():  # NOTE: no autograd graph: a plain write
        c = plait.capture(f, (torch.randn(3, requires_grad=True),))
    assert c.graph is not None


def _set_data(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.data = torch.ones(3)
    return y + 1


def _detach_inplace(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.detach_()
    return y + 1


@pytest.mark.parametrize("fn", [_set_data, _detach_inplace])
def test_data_writes_and_detach_inplace_are_clear_errors(fn: Any) -> None:
    with pytest.raises(GraphCaptureError, match="autograd state") as info:
        plait.capture(fn, (torch.randn(3),))
    assert info.value.kind == "limitation"
    assert info.value.lineno is not None
    compiled = plait.compile(fn, backend="eager")
    x = torch.randn(3)
    with pytest.warns(CaptureFallbackWarning, match="eagerly"):
        assert_same(compiled(x), fn(x))
    assert compiled.specializations[0].graph is None

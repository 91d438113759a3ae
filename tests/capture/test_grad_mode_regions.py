"""``torch.no_grad()`` (and ``set_grad_enabled(False)``, ``@torch.no_grad()``) inside a compiled
program: captured, the values computed inside carry no gradient (``detach`` in the graph), so
outputs, gradients and buffers equal eager's, bitwise, on fresh inputs; turning grad mode on
inside a call made under ``no_grad`` and leaving the mode changed are clear refusals; capture
always restores the caller's grad mode."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.capture.helpers import assert_same, assert_state_equal
from tests.util import contract_tol


class _NoGradInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        with torch.no_grad():
            scale = h.abs().mean(0) + 1  # NOTE: a statistic that takes no gradient
            self.ema.mul_(0.9).add_(h.mean(0), alpha=0.1)
            row = h[0]  # NOTE: a view made inside the region
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        shift = h.sum() * 0.0 + 0.5
        torch.set_grad_enabled(prev)
        return h / scale + row + shift + self.stat(h)

    @torch.no_grad()
    def stat(self, h: torch.Tensor) -> torch.Tensor:
        return h.max()


def _grads(model: nn.Module, x: torch.Tensor, out: torch.Tensor) -> list[torch.Tensor]:
    out.pow(2).sum().backward()
    assert x.grad is not None
    return [x.grad, *(p.grad for p in model.parameters() if p.grad is not None)]


def test_no_grad_region_matches_eager_outputs_gradients_and_buffers() -> None:
    torch.manual_seed(0)
    model = _NoGradInside()
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, backend="eager", fullgraph=True)
    for i in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 + i))
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        got, want = compiled(xa), reference(xb)
        assert not got.requires_grad or want.requires_grad
        assert_same(got, want, f"call {i}")
        assert_same(_grads(model, xa, got), _grads(reference, xb, want), f"grads {i}")
        assert_state_equal(model, reference)
        assert torch.is_grad_enabled()
    spec = compiled.specializations[0]
    assert spec.fallback_reason is None
    assert sum(n.op == "detach" for n in spec.graph.nodes) >= 4


def test_no_grad_region_under_an_outer_no_grad_adds_nothing() -> None:
    torch.manual_seed(0)
    model = _NoGradInside()
    compiled = plait.compile(copy.deepcopy(model), backend="eager", fullgraph=True)
    with torch.no_grad():
        for i in range(2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(20 + i))
            assert_same(compiled(x), model(x), f"call {i}")
    assert not any(n.op == "detach" for n in compiled.specializations[0].graph.nodes)


def _enable_inside(x: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        return x * 2


def test_enabling_grad_inside_a_no_grad_call_is_refused_and_mode_restored() -> None:
    with torch.no_grad():
        with pytest.raises(GraphCaptureError, match="enabling grad mode") as info:
            plait.capture(_enable_inside, (torch.randn(3),))
        assert info.value.kind == "limitation"
        assert not torch.is_grad_enabled()
        compiled = plait.compile(_enable_inside, backend="eager")
        x = torch.randn(3, requires_grad=True)
        with pytest.warns(CaptureFallbackWarning, match="enabling grad mode"):
            out = compiled(x)
        assert out.requires_grad  # NOTE: the fallback ran it eagerly, as eager does
        assert not torch.is_grad_enabled()


def _leaves_grad_off(x: torch.Tensor) -> torch.Tensor:
    torch.set_grad_enabled(False)
    return x * 2


def test_a_program_that_leaves_grad_mode_changed_is_refused() -> None:
    with pytest.raises(GraphCaptureError, match="leaves grad mode False"):
        plait.capture(_leaves_grad_off, (torch.randn(3),))
    assert torch.is_grad_enabled()


def _fails_inside_no_grad(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if x.sum() > 0:  # NOTE: a data read: capture fails inside the region
            return x
    return x * 2


def test_capture_failing_inside_a_region_restores_grad_mode() -> None:
    with pytest.raises(GraphCaptureError, match="bool"):
        plait.capture(_fails_inside_no_grad, (torch.randn(3),))
    assert torch.is_grad_enabled()


def _writes_under_no_grad(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        x.mul_(2)  # NOTE: eager's gradient still reaches x as if unwritten
    return x * 3


def test_a_write_inside_no_grad_to_a_tensor_that_requires_grad_is_refused() -> None:
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(GraphCaptureError, match=r"inside torch\.no_grad") as info:
        plait.capture(_writes_under_no_grad, (x,))
    assert info.value.kind == "limitation"
    compiled = plait.compile(_writes_under_no_grad, backend="eager")
    a, b = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    with pytest.warns(CaptureFallbackWarning, match=r"inside torch\.no_grad"):
        got = compiled(a)
    want = _writes_under_no_grad(b)
    assert_same(got, want)
    got.sum().backward()
    want.sum().backward()
    assert_same(a.grad, b.grad)


class _InferenceModeInside(nn.Module):
    """A statistic computed inside ``torch.inference_mode()`` (a C++ guard, no torch function
    call): eager's gradient treats it as a constant, as inside ``torch.no_grad()``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        with torch.inference_mode():
            shift = h.mean() * 2
        return torch.sin(h) + shift


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_inference_mode_region_takes_no_gradient(backend: str) -> None:
    torch.manual_seed(0)
    model = _InferenceModeInside()
    reference = copy.deepcopy(model)
    # NOTE: Stax has no kernel for detach (a node run by PyTorch): not fullgraph there
    compiled = plait.compile(model, backend=backend, fullgraph=backend == "eager")
    for i in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(30 + i))
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        got, want = compiled(xa), reference(xb)
        got.sum().backward()
        want.sum().backward()
        for a, b in zip([xa, *model.parameters()], [xb, *reference.parameters()]):
            assert a.grad is not None and b.grad is not None
            torch.testing.assert_close(a.grad, b.grad, **contract_tol("model", torch.float32))
        assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    assert any(n.op == "detach" for n in compiled.specializations[0].graph.nodes)

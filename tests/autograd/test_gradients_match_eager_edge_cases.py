"""Gradients through compiled programs at edge cases, judged against eager on random draws."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol


class Masked(nn.Module):
    """A reduction of a value of data-dependent size: the backward expands a scalar cotangent
    to the forward's count of selected elements, a size no backward input has."""

    def __init__(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5, 7, generator=torch.Generator().manual_seed(4)))
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(torch.masked_select(torch.tanh(self.w * x), x > 0))


REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum": torch.sum,
    "mean": torch.mean,
    "amax": torch.amax,
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_a_reduction_of_a_data_dependent_size_trains_with_eagers_gradients(name: str) -> None:
    model = Masked(REDUCTIONS[name])
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    gen = torch.Generator().manual_seed(17)
    for draw in range(3):
        x = torch.randn(5, 7, generator=gen)
        if draw == 0:
            with pytest.warns(CaptureFallbackWarning, match="data-dependent size"):
                got = compiled(x)
        else:
            got = compiled(x)
        want = model(x)
        torch.testing.assert_close(got, want, **contract_tol("reduction", torch.float32))
        got.backward()
        want.backward()
        assert compiled.w.grad is not None and model.w.grad is not None
        torch.testing.assert_close(
            compiled.w.grad, model.w.grad, **contract_tol("reduction", torch.float32)
        )


COMPLEX_PATHS: dict[str, tuple[Callable[..., torch.Tensor], torch.dtype]] = {
    # NOTE: a real input whose gradient flows back through complex intermediates
    "rfft": (lambda x: torch.fft.rfft(x).abs().sum() + x.sum(), torch.float32),
    "times-1j": (lambda x: ((x * (1 + 1j)).abs() * x).sum(), torch.float32),
    "polar": (lambda x: (torch.polar(x, x).real + x).sum(), torch.float32),
    # NOTE: complex inputs that require grad (conjugate Wirtinger gradients)
    "abs": (lambda z: z.abs().sum(), torch.complex64),
    "times-conj": (lambda z: (z * z.conj()).real.sum() * z.abs().sum(), torch.complex64),
    "view-as-real": (lambda z: torch.view_as_real(z * z).square().sum(), torch.complex64),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_PATHS))
def test_a_gradient_through_complex_values_is_eagers(name: str) -> None:
    """Compiled derivative rules are real: a gradient reaching a complex value falls back to
    eager autograd (loudly), never dropped (a detached result, a lost term)."""
    fn, dtype = COMPLEX_PATHS[name]
    compiled = plait.compile(fn, backend="stax")
    gen = torch.Generator().manual_seed(23)
    for draw in range(3):
        x = torch.randn(6, generator=gen, dtype=dtype)
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        if draw == 0:
            with pytest.warns(CaptureFallbackWarning, match="complex value"):
                got = compiled(ours)
        else:
            got = compiled(ours)
        want = fn(theirs)
        assert got.requires_grad
        torch.testing.assert_close(got, want, **contract_tol("pointwise", torch.float32))
        got.backward()
        want.backward()
        # NOTE: a complex gradient is judged by the row of its parts, as the gate does
        torch.testing.assert_close(
            ours.grad, theirs.grad, **contract_tol("pointwise", torch.float32)
        )


def _write_all(how: str) -> Callable[[torch.Tensor], torch.Tensor]:
    def write(h: torch.Tensor) -> torch.Tensor:
        if how == "fill_":
            h.fill_(0.5)
        elif how == "zero_":
            h.zero_()
        elif how == "copy_":
            h.copy_(torch.arange(5.0))
        elif how == "setitem":
            h[:] = 0.5
        else:  # NOTE: one index of a dim of size one writes every element too
            h.view(1, *h.shape)[0] = 0.5
        return h

    return write


class Overwritten(nn.Module):
    """A head whose activations are overwritten in place (an ablated branch): eager's result
    keeps the write's history, so the head's parameters get zero gradients, not None."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.body = nn.Linear(5, 5)
        self.head = nn.Linear(5, 5)
        self.write = _write_all(how)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(self.body(x)), self.write(self.head(x))


@pytest.mark.parametrize("how", ["fill_", "zero_", "copy_", "setitem", "setitem-select"])
def test_a_tensor_written_over_in_place_keeps_its_history(how: str) -> None:
    torch.manual_seed(5)
    model = Overwritten(how)
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (compiled, model)]
    gen = torch.Generator().manual_seed(29)
    for _ in range(3):
        x = torch.randn(4, 5, generator=gen)
        for m, opt in zip((compiled, model), opts):
            opt.zero_grad()
            body, head = m(x)
            assert head.requires_grad
            (body.square().sum() + head.sum()).backward()
            opt.step()
        for name, p in model.named_parameters():
            q = compiled.get_parameter(name)
            assert (q.grad is None) == (p.grad is None), name
            torch.testing.assert_close(q.grad, p.grad, **contract_tol("model", torch.float32))
            torch.testing.assert_close(q, p, **contract_tol("model", torch.float32))


@pytest.mark.parametrize("mean", [0.0, 1.5])
def test_an_in_place_normal_draw_into_a_tensor_that_requires_grad_trains(mean: float) -> None:
    """Functionalized, ``normal_`` is an ATen overload PyTorch's autograd has no formula for;
    eager's in-place draw has a zero one, and so has the compiled call."""

    def fn(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        h = p * 2
        h.normal_(mean)
        return (h * x + p.sin()).sum()

    compiled = plait.compile(fn, backend="stax")
    gen = torch.Generator().manual_seed(31)
    for seed in range(3):
        x, p = torch.randn(5, generator=gen), torch.randn(5, generator=gen)
        ours, theirs = p.clone().requires_grad_(), p.clone().requires_grad_()
        torch.manual_seed(seed)
        got = compiled(x, ours)
        torch.manual_seed(seed)
        want = fn(x, theirs)
        torch.testing.assert_close(got, want, **contract_tol("pointwise", torch.float32))
        got.backward()
        want.backward()
        torch.testing.assert_close(
            ours.grad, theirs.grad, **contract_tol("pointwise", torch.float32)
        )

"""A compiled training call that writes one of its inputs in place where eager's input then
carries the write's autograd history (an input that needs no grad written with a value that
does; a non-leaf input that requires grad): a compiled call cannot give the caller's tensor that
history, so plait runs such a program eagerly, warned and recorded (``fullgraph=True`` refuses
it), and a loss that reads the input again differentiates through the write as in eager."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.conformance.models import randn
from tests.util import contract_tol


def _refused_loudly(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> None:
    """The default compile warns that it runs ``fn`` eagerly; ``fullgraph=True`` raises."""
    with pytest.warns(CaptureFallbackWarning, match="in-place update of input"):
        plait.compile(fn, backend="stax")(*(a.clone() for a in args))
    with pytest.raises(GraphCaptureError, match="in-place update of input"):
        plait.compile(fn, backend="stax", fullgraph=True)(*(a.clone() for a in args))


def _add_exp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.add_(torch.exp(w))
    return (x * w).sum()


def _addcmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.addcmul_(w, w)  # NOTE: no capture rule: written through its out-of-place form (opaque)
    return (x * w).sum()


def _lerp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.lerp_(w, 0.3)
    return (x * w).sum()


@pytest.mark.parametrize("program", [_add_exp, _addcmul, _lerp], ids=lambda f: f.__name__)
def test_an_input_written_with_a_differentiable_value_keeps_the_writes_history(
    program: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    compiled = plait.compile(program, backend="stax")
    _refused_loudly(program, randn(4, seed=7), randn(4, seed=8).requires_grad_(True))
    for seed in (1, 2):
        x0, w0 = randn(4, seed=seed), randn(4, seed=seed + 50)
        grads = []
        for fn in (program, compiled):
            x, w = x0.clone(), w0.clone().requires_grad_(True)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CaptureFallbackWarning)
                loss = fn(x, w)
            assert x.requires_grad, "the written input lost the write's autograd history"
            (loss + x.square().sum()).backward()
            grads.append(w.grad)
        torch.testing.assert_close(grads[1], grads[0], **contract_tol("pointwise", torch.float32))


def _mul_sigmoid(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(torch.sigmoid(y))
    return torch.sin(x)


def test_an_in_place_write_to_a_non_leaf_input_trains_as_eager() -> None:
    compiled = plait.compile(_mul_sigmoid, backend="stax")
    _refused_loudly(_mul_sigmoid, randn(3, 4, seed=9).requires_grad_(True) * 2.0, randn(4, seed=10))
    for seed in (3, 4):
        a0, y0 = randn(3, 4, seed=seed), randn(4, seed=seed + 50)
        grads = []
        for fn in (_mul_sigmoid, compiled):
            a, y = a0.clone().requires_grad_(True), y0.clone().requires_grad_(True)
            x = a * 2.0  # NOTE: not a leaf: eager lets the call write it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CaptureFallbackWarning)
                out = fn(x, y)
            (out.sum() + x.square().sum()).backward()
            grads.append((a.grad, y.grad))
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want, **contract_tol("pointwise", torch.float32))

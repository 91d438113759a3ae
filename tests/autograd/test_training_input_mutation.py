"""A compiled training call that writes one of its inputs in place: the written input carries
the write's autograd history afterwards, as in eager (a loss that reads it again differentiates
through the write)."""

from __future__ import annotations

import pytest
import torch

import plait
from tests.conformance.models import randn
from tests.util import contract_tol


def _add_exp(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x.add_(torch.exp(w))
    return (x * w).sum()


@pytest.mark.xfail(
    strict=True,
    reason="the write-back of an in-place update of a user input (Program.run in "
    "src/plait/frontend/program.py) copies the result into the input under torch.no_grad(), "
    "and backends._training_program leaves written outputs out of the differentiable ones: "
    "an input that needs no grad, written with a value that does, comes back without the "
    "write's history (requires_grad False), so a loss that reads it again silently misses "
    "that path of the gradient",
)
def test_an_input_written_with_a_differentiable_value_keeps_the_writes_history() -> None:
    compiled = plait.compile(_add_exp, backend="stax")
    for seed in (1, 2):
        x0, w0 = randn(4, seed=seed), randn(4, seed=seed + 50)
        grads = []
        for fn in (_add_exp, compiled):
            x, w = x0.clone(), w0.clone().requires_grad_(True)
            loss = fn(x, w)
            assert x.requires_grad, "the written input lost the write's autograd history"
            (loss + x.square().sum()).backward()
            grads.append(w.grad)
        torch.testing.assert_close(grads[1], grads[0], **contract_tol("pointwise", torch.float32))


def _mul_sigmoid(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.mul_(torch.sigmoid(y))
    return torch.sin(x)


@pytest.mark.xfail(
    strict=True,
    reason="capture (CaptureValues.assign in src/plait/frontend/capture_values.py) takes every "
    "user input that requires grad for a leaf and raises 'a leaf Variable that requires grad "
    "is being used in an in-place operation' on an in-place write to it; eager allows the "
    "write to an input that is not a leaf (the result of an op)",
)
def test_an_in_place_write_to_a_non_leaf_input_trains_as_eager() -> None:
    compiled = plait.compile(_mul_sigmoid, backend="stax")
    for seed in (3, 4):
        a0, y0 = randn(3, 4, seed=seed), randn(4, seed=seed + 50)
        grads = []
        for fn in (_mul_sigmoid, compiled):
            a, y = a0.clone().requires_grad_(True), y0.clone().requires_grad_(True)
            x = a * 2.0  # NOTE: not a leaf: eager lets the call write it
            (fn(x, y).sum() + x.square().sum()).backward()
            grads.append((a.grad, y.grad))
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want, **contract_tol("pointwise", torch.float32))

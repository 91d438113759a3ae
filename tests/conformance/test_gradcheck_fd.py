"""Finite-difference checks of derivative rules, in float64, with budgets from the contract."""

from __future__ import annotations

import doctest
import sys
from typing import Any

import pytest
import torch
from torch import nn

import plait.conformance
import plait.conformance.draws
import plait.conformance.gate
import plait.conformance.gradcheck
import plait.conformance.report
import plait.conformance.tree
import plait.contract
from plait.conformance import gradcheck_fd
from tests.conformance.models import randn, seeded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SquareWrongBackward(torch.autograd.Function):
    """x**2 whose backward forgets the factor 2: a derivative rule with a bug."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x


class ScaledLinear(nn.Module):
    """A linear layer whose weight gradient is scaled by a bug (via a hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.lin.weight
        if torch.is_grad_enabled() and w.requires_grad:
            w = w * 1.0
            w.register_hook(lambda g: g * 1.5)
        return x @ w.T + self.lin.bias


def test_correct_derivatives_pass() -> None:
    assert gradcheck_fd(torch.tanh, (randn(6, seed=1),)).ok
    assert gradcheck_fd(
        lambda a, b: (a * b).sin().sum(0), (randn(3, 4, seed=2), randn(4, seed=3))
    ).ok
    assert gradcheck_fd(seeded(1, lambda: nn.Linear(4, 3)), (randn(2, 4, seed=4),)).ok


def test_a_wrong_backward_is_caught() -> None:
    report = gradcheck_fd(SquareWrongBackward.apply, (randn(5, seed=5),))
    assert report.caught("grad[input[0]]", "tolerance")
    failure = report.errors[0]
    assert failure.expected is not None and failure.actual is not None
    assert failure.actual == pytest.approx(failure.expected / 2)


def test_a_wrong_parameter_gradient_is_caught() -> None:
    report = gradcheck_fd(seeded(2, ScaledLinear), (randn(2, 4, seed=6),))
    assert report.caught("grad[lin.weight]")
    assert not report.caught("grad[lin.bias]")


def test_sampled_elements_still_catch_a_wrong_rule() -> None:
    report = gradcheck_fd(SquareWrongBackward.apply, (randn(40, 40, seed=7),), max_elements=64)
    assert report.caught("grad[input[0]]")


def test_everything_runs_in_float64() -> None:
    report = gradcheck_fd(lambda x: (x * 2).float(), (randn(3, seed=8),))
    assert report.caught("output", "setup")


def test_step_and_budgets_come_from_the_contract() -> None:
    data = tomllib.loads(plait.contract.default_text())
    data["gradcheck"]["eps"] = data["gradcheck"]["eps"] * 10
    contract = plait.contract.from_data(data)
    report = gradcheck_fd(torch.exp, (randn(4, seed=9),), contract=contract)
    assert report.ok
    assert all(f"eps {contract.gradcheck.eps:g}" in f.case for f in report.failures) or not (
        report.failures
    )
    assert report.contract_version == contract.version


@pytest.mark.parametrize(
    "module",
    [
        plait.conformance,
        plait.conformance.draws,
        plait.conformance.gate,
        plait.conformance.gradcheck,
        plait.conformance.report,
        plait.conformance.tree,
    ],
    ids=lambda m: m.__name__,
)
def test_docstring_examples_run(module: Any) -> None:
    failures, _ = doctest.testmod(module, verbose=False)
    assert failures == 0

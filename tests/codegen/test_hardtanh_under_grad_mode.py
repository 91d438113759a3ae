"""``hardtanh`` and ``relu6`` compiled under grad mode run on Stax, with eager's values and
gradients.

Under grad mode capture writes ``hardtanh`` as ``where(lo < x < hi, x, detach(clamp(x)))`` (its
gradient is zero at either bound, where clamp's passes). ``detach`` changes no value, so Stax
runs it as an identity view: a MobileNet-style model called without ``torch.no_grad()`` (eval
mode, parameters requiring grad) compiles whole, as one called under it does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from tests.util import contract_tol

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "hardtanh(-2, 3)": lambda x: F.hardtanh(x, -2.0, 3.0),
}


def _draw(seed: int, requires_grad: bool = False) -> torch.Tensor:
    """Random values with every bound, NaN and the infinities among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 40, generator=g) * 4
    marks = torch.tensor(
        [0.0, 6.0, -1.0, 1.0, -2.0, 3.0, float("nan"), float("inf"), -float("inf")]
    )
    x.view(-1)[torch.randperm(x.numel(), generator=g)[: marks.numel()]] = marks
    return x.requires_grad_(requires_grad)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_values_under_grad_mode_with_inputs_not_requiring_grad(name: str) -> None:
    f = ACTIVATIONS[name]
    compiled = plait.compile(f, fullgraph=True, options={"cache": False})
    for seed in (1, 2, 3):
        x = _draw(seed)
        assert torch.equal(compiled(x).isnan(), f(x).isnan())
        torch.testing.assert_close(
            compiled(x), f(x), equal_nan=True, **contract_tol("pointwise", x.dtype)
        )


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_gradient_is_zero_at_the_bounds_as_in_eager(name: str) -> None:
    f = ACTIVATIONS[name]
    compiled = plait.compile(lambda x: f(x * 1.0), fullgraph=True, options={"cache": False})
    for seed in (4, 5):
        x = _draw(seed, requires_grad=True)
        with torch.no_grad():
            x.nan_to_num_(0.5, 0.5, 0.5)  # NOTE: eager's gradient at NaN depends on its loop
        cot = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
        (want,) = torch.autograd.grad(f(x * 1.0), x, cot)
        (got,) = torch.autograd.grad(compiled(x), x, cot)
        assert torch.equal(got == 0, want == 0)
        torch.testing.assert_close(got, want, **contract_tol("pointwise", x.dtype))


def test_eval_model_called_without_no_grad_compiles_whole() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU6(),
        nn.Flatten(),
        nn.Linear(8 * 36, 5),
    ).eval()
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    for seed in (6, 7):
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(seed)) * 3
        want, got = model(x), compiled(x)
        torch.testing.assert_close(got, want, **contract_tol("model", x.dtype))
        grads = torch.autograd.grad(want.sum(), list(model.parameters()))
        compiled_grads = torch.autograd.grad(got.sum(), list(model.parameters()))
        for w, g in zip(grads, compiled_grads):
            torch.testing.assert_close(g, w, **contract_tol("model", x.dtype))
    manifest = compiled.specializations[-1].compiled.manifest
    assert manifest.autograd and not manifest.fallbacks, manifest.fallbacks
    assert manifest.executor["backward"]["evidence"]["counts"]["fallback"] == 0

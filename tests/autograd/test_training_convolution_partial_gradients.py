"""A training convolution where only some of its input, weight and bias take a gradient (a
frozen weight with a trainable bias, a convolution on the data) compiles its backward and gives
eager's gradients: ``convolution_backward``'s results are the ones its ``output_mask`` asks for
(PyTorch's CPU kernel also computes the weight's gradient when it computes the bias's; its meta
kernel does not), typed and run alike."""

from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
from torch import nn

import plait
from tests.conformance.models import randn, seeded
from tests.util import contract_tol

# NOTE: (input, weight, bias) requiring grad; at least one, or there is no backward
MASKS = [m for m in itertools.product((False, True), repeat=3) if any(m)]


def _name(mask: tuple[bool, ...]) -> str:
    return "+".join(n for n, on in zip(("input", "weight", "bias"), mask) if on)


@pytest.mark.parametrize("mask", MASKS, ids=_name)
def test_convolution_gradients_for_any_subset_of_its_operands(
    mask: tuple[bool, bool, bool],
) -> None:
    wants_x, wants_w, wants_b = mask
    model = seeded(9, lambda: nn.Conv2d(4, 3, 3, padding=1))
    model.weight.requires_grad_(wants_w)
    model.bias.requires_grad_(wants_b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a backward that fell back to eager warns
        compiled = plait.compile(copy.deepcopy(model), backend="stax")
        for seed in (1, 2, 3):
            x, g = randn(2, 4, 5, 5, seed=seed), randn(2, 3, 5, 5, seed=seed + 100)
            grads = []
            for m in (model, compiled):
                m.zero_grad(set_to_none=True)
                leaf = x.clone().requires_grad_(wants_x)
                m(leaf).backward(g)
                grads.append([leaf.grad, m.weight.grad, m.bias.grad])
            for what, got, want in zip(("input", "weight", "bias"), grads[1], grads[0]):
                assert (got is None) == (want is None), what
                if want is not None:
                    torch.testing.assert_close(
                        got, want, **contract_tol("conv", torch.float32), msg=what
                    )
    m = compiled.specializations[-1].compiled.manifest
    assert m.autograd and not m.fallbacks, m.fallbacks

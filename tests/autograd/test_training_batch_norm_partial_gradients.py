"""A training batch norm where only some of its input, weight and bias take a gradient (a batch
norm on the data, a frozen affine weight, a frozen backbone with trainable norms) compiles its
backward and gives eager's gradients: the backward kernel's results are the ones its
``output_mask`` asks for, and the node is typed so."""

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
@pytest.mark.parametrize("rank", [2, 4])
def test_batch_norm_gradients_for_any_subset_of_its_operands(
    mask: tuple[bool, bool, bool], rank: int
) -> None:
    wants_x, wants_w, wants_b = mask
    model = seeded(rank, lambda: nn.BatchNorm1d(6) if rank == 2 else nn.BatchNorm2d(6))
    model.weight.requires_grad_(wants_w)
    model.bias.requires_grad_(wants_b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a backward that fell back to eager warns
        compiled = plait.compile(copy.deepcopy(model), backend="stax")
        shape = (5, 6) if rank == 2 else (3, 6, 4, 4)
        for seed in (1, 2, 3):
            x, g = randn(*shape, seed=seed), randn(*shape, seed=seed + 100)
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
                        got, want, **contract_tol("normalization", torch.float32), msg=what
                    )
            for name, buf in model.named_buffers():
                assert torch.equal(buf, dict(compiled.named_buffers())[name]), name
    m = compiled.specializations[-1].compiled.manifest
    assert m.autograd and not m.fallbacks, m.fallbacks

"""A compiled callable called inside another's capture (``plait.compile(model)`` of a model
whose block was compiled first, a compiled function calling a compiled helper) is part of the
outer program: the outer capture traces through it and compiles whole, with no fallback and no
warning, and the inner, called on its own later, compiles its own program. Before, the outer
ran eagerly and the inner kept that call's fallback for good."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

pytestmark = pytest.mark.usefixtures("plait_cache_dir")


def _draw(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)) + 1)


def _no_fallback(compiled: object) -> None:
    spec = compiled.specializations[-1]  # type: ignore[attr-defined]
    assert spec.program.fallback_reason is None
    assert spec.compiled.manifest.fallbacks == []


def test_compiled_submodule_inside_compiled_model_compiles_whole() -> None:
    torch.manual_seed(0)
    model = _Model().eval()
    reference = _Model().eval()
    reference.load_state_dict(model.state_dict())
    model.block = plait.compile(model.block)
    compiled = plait.compile(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(3):
            x = _draw(seed, 5, 8)
            torch.testing.assert_close(
                compiled(x), reference(x), **contract_tol("model", torch.float32)
            )
    _no_fallback(compiled)
    assert len(compiled.specializations) == 1
    assert model.block.specializations == []  # NOTE: the outer capture traced through it
    x = _draw(7, 5, 16)
    torch.testing.assert_close(
        model.block(x), reference.block(x), **contract_tol("model", torch.float32)
    )
    _no_fallback(model.block)


def test_compiled_function_calling_a_compiled_function_sees_parameter_updates() -> None:
    torch.manual_seed(1)
    layer = nn.Linear(8, 8)
    inner = plait.compile(lambda x: torch.tanh(layer(x)) * 2)

    def outer(x: torch.Tensor) -> torch.Tensor:
        return inner(x - 1) + x

    def eager(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(layer(x - 1)) * 2 + x

    compiled = plait.compile(outer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(3):
            with torch.no_grad():
                layer.weight.add_(_draw(100 + seed, 8, 8) * 0.1)  # NOTE: as an optimizer would
            x = _draw(seed, 3, 8)
            with torch.no_grad():
                got, want = compiled(x), eager(x)
            torch.testing.assert_close(got, want, **contract_tol("model", torch.float32))
    _no_fallback(compiled)
    assert inner.specializations == []

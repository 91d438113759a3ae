"""Module backward hooks of a compiled training module fire as in eager: a full backward hook
registered on the compiled module sees eager's grad_input and grad_output, and what it returns
replaces the gradient of the module's inputs."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import plait
from tests.conformance.models import randn, seeded
from tests.util import contract_tol


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(5, 6)
        self.second = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def _compiled(model: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a backward that fell back to eager warns
        return plait.compile(copy.deepcopy(model), backend="stax")


def _run(model: nn.Module, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    leaf = x.clone().requires_grad_(True)
    model(leaf).backward(g)
    assert leaf.grad is not None
    return leaf.grad


def _close(got: Any, want: Any, what: str) -> None:
    assert len(got) == len(want), what
    for a, b in zip(got, want):
        assert (a is None) == (b is None), what
        if a is not None:
            torch.testing.assert_close(a, b, **contract_tol("matmul", torch.float32), msg=what)


def test_full_backward_hook_on_the_compiled_module_sees_eagers_gradients() -> None:
    model = seeded(3, Stack)
    compiled = _compiled(model)
    seen: dict[str, list[Any]] = {"eager": [], "plait": []}
    for key, m in (("eager", model), ("plait", compiled)):
        m.register_full_backward_hook(lambda mod, gi, go, key=key: seen[key].append((gi, go)))
    for seed in (1, 2, 3):
        x, g = randn(3, 5, seed=seed), randn(3, 4, seed=seed + 100)
        _close([_run(compiled, x, g)], [_run(model, x, g)], "input gradient")
    assert len(seen["plait"]) == len(seen["eager"]) == 3
    for (gi, go), (want_gi, want_go) in zip(seen["plait"], seen["eager"]):
        _close(gi, want_gi, "grad_input")
        _close(go, want_go, "grad_output")


def test_full_backward_hook_on_the_compiled_module_replaces_the_input_gradient() -> None:
    model = seeded(4, Stack)
    compiled = _compiled(model)
    for m in (model, compiled):
        m.register_full_backward_hook(lambda mod, gi, go: (gi[0] * -3.0,))
    for seed in (5, 6):
        x, g = randn(3, 5, seed=seed), randn(3, 4, seed=seed + 100)
        _close([_run(compiled, x, g)], [_run(model, x, g)], "input gradient")


def test_full_backward_hook_on_a_submodule_sees_eagers_gradients() -> None:
    model = seeded(5, Stack)
    compiled = _compiled(model)
    seen: dict[str, list[Any]] = {"eager": [], "plait": []}
    for key, m in (("eager", model), ("plait", compiled)):
        m.first.register_full_backward_hook(lambda mod, gi, go, key=key: seen[key].append((gi, go)))
    x, g = randn(3, 5, seed=7), randn(3, 4, seed=8)
    _close([_run(compiled, x, g)], [_run(model, x, g)], "input gradient")
    assert len(seen["plait"]) == len(seen["eager"]) == 1
    _close(seen["plait"][0][0], seen["eager"][0][0], "grad_input")


def test_full_backward_hook_on_a_submodule_is_named_under_fullgraph() -> None:
    """A whole-graph compile refuses it, naming the submodule (no crash inside nn.Module)."""
    model = seeded(6, Stack)
    model.second.register_full_backward_hook(lambda mod, gi, go: None)
    compiled = plait.compile(model, backend="stax", fullgraph=True)
    with pytest.raises(plait.GraphCaptureError, match="submodule second has a backward hook"):
        compiled(randn(3, 5, seed=9).requires_grad_(True))
    with torch.no_grad():  # NOTE: no gradient, no hook: it compiles
        x = randn(3, 5, seed=10)
        torch.testing.assert_close(compiled(x), model(x), **contract_tol("matmul", torch.float32))

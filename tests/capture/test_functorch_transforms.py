"""torch.func transforms inside a compiled program (``vmap``, ``jacrev``, ``grad``): their
batched and dual tensors cannot be captured, so the program is the loud eager fallback with
eager's results (``vmap`` of a traced batch size raised PyTorch's internal assert, ``jacrev``
a storage error), and ``fullgraph=True`` raises a capture error."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import assert_bitwise

NO_CACHE = {"cache": False}


def _vmap(x: torch.Tensor) -> torch.Tensor:
    return torch.vmap(lambda r: r.dot(r))(x)


def _jacrev(x: torch.Tensor) -> torch.Tensor:
    return torch.func.jacrev(lambda t: t.sin().sum(0))(x)


def _grad(x: torch.Tensor) -> torch.Tensor:
    return torch.func.grad(lambda t: (t**3).sum())(x)


@pytest.mark.parametrize("program", [_vmap, _jacrev, _grad], ids=["vmap", "jacrev", "grad"])
def test_a_transform_runs_eagerly_with_a_warning(program: Callable[..., torch.Tensor]) -> None:
    compiled = plait.compile(program, options=NO_CACHE)
    with pytest.warns(CaptureFallbackWarning):
        for _ in range(2):
            x = torch.randn(4, 3)
            assert_bitwise(compiled(x), program(x))


@pytest.mark.parametrize("program", [_vmap, _jacrev], ids=["vmap", "jacrev"])
def test_fullgraph_raises_a_capture_error(program: Callable[..., torch.Tensor]) -> None:
    compiled = plait.compile(program, fullgraph=True, options=NO_CACHE)
    with pytest.raises(GraphCaptureError):
        compiled(torch.randn(4, 3))

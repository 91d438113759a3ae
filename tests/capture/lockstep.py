"""A compiled model and its eager twin (a deep copy) called alike on fresh inputs under
``no_grad``: outputs equal within the contract's model row, and a check of the two after each
call (counters, logs, buffers: the Python side effects of each call)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


def inputs(n: int, seed: int, rows: int = 2) -> Iterator[torch.Tensor]:
    """``n`` fresh ``[rows, 4]`` draws of one seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield torch.randn(rows, 4, generator=gen)


def lockstep(
    model: nn.Module,
    check: Callable[[nn.Module, nn.Module], None],
    *,
    calls: int = 4,
    seed: int = 1,
    rows: int = 2,
    as_function: bool = False,
    **compile: Any,
) -> None:
    """``model`` compiled (``as_function``: a function calling it) beside its eager twin."""
    twin = copy.deepcopy(model)
    target = (lambda x: model(x)) if as_function else model
    compiled = plait.compile(target, options={"cache": False}, **compile)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for x in inputs(calls, seed=seed, rows=rows):
            torch.testing.assert_close(compiled(x), twin(x), **TOL)
            check(model, twin)

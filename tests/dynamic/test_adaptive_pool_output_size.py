"""An adaptive average pool's output size follows its arguments at every size: a ``None``
entry keeps the input's size (``nn.AdaptiveAvgPool2d((None, 2))``), and an output size computed
from a size (``x.shape[2] // 2``, another input's ``y.shape[0]``) changes with it. The capture used
to read the output size from the capture sample's result and leave the sizes that chose it
symbolic and unguarded: every later size got the capture's output size."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)
CALLS = ((6, 3), (7, 4), (3, 6), (9, 2), (5, 5), (8, 7))

CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "none_height": lambda x, y: F.adaptive_avg_pool2d(x, (None, 2)),
    "none_width": lambda x, y: F.adaptive_avg_pool2d(x, (2, None)),
    "module_none": lambda x, y: torch.nn.AdaptiveAvgPool2d((None, 3))(x),
    "half_height": lambda x, y: F.adaptive_avg_pool2d(x, (x.shape[2] // 2, 2)),
    "other_input": lambda x, y: F.adaptive_avg_pool2d(x, (y.shape[0], 2)),
    "pool1d_other_input": lambda x, y: F.adaptive_avg_pool1d(x[:, :, 0], y.shape[0]),
    "pool1d_own_size": lambda x, y: F.adaptive_avg_pool1d(x[:, :, 0], x.shape[2] - 1),
}


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("name", sorted(CASES))
def test_adaptive_pool_output_size_follows_its_arguments(name: str, dynamic: bool | None) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, dynamic=dynamic, options={"cache": False, "recompile_limit": 20})
    for seed, (a, b) in enumerate(CALLS):
        torch.manual_seed(seed)
        x, y = torch.randn(2, 3, a, a + 1), torch.randn(b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(x, y)
        assert got.shape == fn(x, y).shape, f"{name} at {(a, b)}"
        torch.testing.assert_close(got, fn(x, y), **TOL)

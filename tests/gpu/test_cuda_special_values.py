"""CUDA programs answer as CUDA eager at special values and compile every extern node: gelu of
+inf is +inf (eager's oneDNN NaN is the CPU's only), and calls whose extern node has no tensor
input (a where of two scalars, cosine similarity) compile. Skipped without CUDA."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.nn import functional as F

import plait
from tests.util import contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TOL = contract_tol("model", torch.float32)

PROGRAMS: dict[str, Callable[..., torch.Tensor]] = {
    "gelu": lambda x, y: F.gelu(x) + y,
    "where_scalars": lambda x, y: torch.where(x > 0, 1.0, -1.0) * y,
    "cosine_similarity": lambda x, y: F.cosine_similarity(x, y, dim=1),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_special_values_answer_as_cuda_eager(name: str) -> None:
    fn = PROGRAMS[name]
    compiled = plait.compile(fn, options={"cache": False})
    for seed in range(2):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(64, 33, device="cuda", generator=gen)
        y = torch.randn(64, 33, device="cuda", generator=gen)
        x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
        want = fn(x, y)
        got = compiled(x, y)
        torch.testing.assert_close(got, want, **TOL, equal_nan=True)

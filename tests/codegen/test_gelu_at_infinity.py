"""gelu of +inf is what eager gives on this machine: NaN where eager runs oneDNN's gelu (a CPU
tensor of more than one element, in float32, and in bfloat16 or float16 where this CPU's oneDNN
takes them), +inf where ATen's loop runs it. Float16 went through ATen's rule in plait (+inf)
where eager ran oneDNN (NaN) on a CPU with AVX-512 FP16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.util import assert_bitwise


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x) * 2


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 5, 40])
def test_gelu_at_the_infinities_is_eagers(dtype: torch.dtype, n: int) -> None:
    compiled = plait.compile(_gelu, options={"cache": False})
    x = torch.randn(n).to(dtype)
    x[torch.randint(0, n, ())] = float("inf")
    if n > 1:
        x[0] = -float("inf")
    got, want = compiled(x), _gelu(x)
    assert_bitwise(got.isnan(), want.isnan(), "NaN positions")
    assert_bitwise(got.isinf(), want.isinf(), "infinite positions")

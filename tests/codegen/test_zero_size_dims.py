"""Views, reshapes, reductions and pointwise kernels over tensors with a zero-size dim, through
``plait.compile`` on Stax, against eager (the index math once took a modulo by the zero extent)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.util import assert_bitwise

CASES: list[tuple[str, Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = [
    ("unflatten-leading", lambda x: torch.unflatten(x, 0, (2, 2)), (4, 0)),
    ("unflatten-zero", lambda x: torch.unflatten(x, 1, (0, 3)), (4, 0)),
    ("reshape-add", lambda x: x.reshape(0, 5) + 1, (5, 0)),
    ("reshape-permute", lambda x: x.reshape(0, 5).permute(1, 0).reshape(5, 0) + 1, (5, 0)),
    ("permute-sum", lambda x: (x.permute(2, 0, 1) * 2).reshape(2, 0, 3).sum(0), (3, 0, 2)),
    ("expand", lambda x: x.view(0, 3, 1).expand(0, 3, 4).contiguous() + 1, (3, 0)),
    ("cat-relu", lambda x: torch.cat([x, x], 1).relu(), (0, 3)),
    ("transpose-reshape", lambda x: x.transpose(0, 1).reshape(-1) * 2, (3, 0, 2)),
    ("sum-empty", lambda x: x.sum(1) + 1, (4, 0)),
]


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize(("name", "fn", "shape"), CASES, ids=[c[0] for c in CASES])
def test_zero_size_dim(
    name: str, fn: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, ...]
) -> None:
    cf = plait.compile(fn, backend="stax")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(shape)
            assert_bitwise(cf(x), fn(x), name)
    assert cf.specializations[-1].fallback_reason is None

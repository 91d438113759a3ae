"""Every optional or empty argument of the pooling rules (an empty stride means the kernel size),
through ``plait.compile`` on Stax, against eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.util import assert_bitwise

CASES: list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = [
    ("avg-empty-stride", lambda x: F.avg_pool2d(x, (2, 2), (), 0, False, True, -2)),
    ("avg-empty-stride-list", lambda x: F.avg_pool2d(x, 2, [])),
    ("avg-none-stride", lambda x: F.avg_pool2d(x, 3, None, 1, True, False, None)),
    ("avg-one-element-stride", lambda x: F.avg_pool2d(x, (2, 3), (1,), (1, 1))),
    ("max-empty-stride", lambda x: F.max_pool2d(x, (2, 2), ())),
    ("max-empty-stride-list", lambda x: F.max_pool2d(x, 3, [], 1, 2, True)),
    ("max-none-stride", lambda x: F.max_pool2d(x, (3, 2), None, (1, 0))),
]


@pytest.mark.usefixtures("stax_cache")
@pytest.mark.parametrize(("name", "fn"), CASES, ids=[c[0] for c in CASES])
def test_pool_arguments(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    cf = plait.compile(fn, backend="stax")
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 7, 8)
            assert_bitwise(cf(x), fn(x), name)
    assert cf.specializations[-1].fallback_reason is None

"""Several integer tensors indexing adjacent dims (``x[i, j]``, ``x[:, i, j]``; transformers'
``padding_mask[batch_idx, kv_idx]``) compile to a native gather, equal to eager bit for bit on
fresh draws (negative and broadcast indices, int32 indices, float, 16-bit, integer and bool
values); an entry out of its own dim raises as eager does, even where the row-major offset
it makes would land inside the tensor; index tensors that are not adjacent stay an opaque node.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise

pytestmark = pytest.mark.usefixtures("plait_cache_dir")


def _ints(g: torch.Generator, n: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(-n, n, shape, generator=g)


CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[int, ...], Callable[..., tuple]]] = {
    "two-leading": (
        lambda x, i, j: x[i, j].flip(0),
        (4, 5, 3),
        lambda g: (_ints(g, 4, (2, 1)), _ints(g, 5, (6,))),
    ),
    "two-after-slice": (
        lambda x, i, j: x[:, i, j].flip(-1),
        (2, 4, 5, 3),
        lambda g: (_ints(g, 4, (3,)), _ints(g, 5, (3,))),
    ),
    "three": (
        lambda x, i, j, k: x[i, j, k].flip(1),
        (3, 4, 5),
        lambda g: (_ints(g, 3, (2, 2)), _ints(g, 4, (2, 2)), _ints(g, 5, (1, 2))),
    ),
    "int32-indices": (
        lambda x, i, j: x[i, j],
        (4, 6),
        lambda g: (_ints(g, 4, (5,)).int(), _ints(g, 6, (5,)).int()),
    ),
    "padding-mask": (
        lambda m, b, k: m[b, k] & (k >= 0),
        (3, 7),
        lambda g: (torch.arange(3)[:, None, None, None], torch.arange(7)[None, None, None, :]),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("name", sorted(CASES))
def test_adjacent_index_tensors_gather_natively(name: str, dtype: torch.dtype) -> None:
    fn, shape, draw = CASES[name]
    compiled = plait.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x = (torch.randn(shape, generator=g) * 4).to(dtype)
            if name == "padding-mask":
                x = torch.rand(shape, generator=g) > 0.3
            args = draw(g)
            assert_bitwise(compiled(x, *args), fn(x, *args), f"{name} {dtype}")
    assert compiled.specializations[-1].program.opaque_counts == {}


def test_an_entry_out_of_its_own_dim_raises_as_eager() -> None:
    fn = plait.compile(lambda x, i, j: x[i, j] + 1)
    x = torch.randn(3, 4)
    i, j = torch.tensor([0, 1]), torch.tensor([1, 2])
    assert_bitwise(fn(x, i, j), x[i, j] + 1)
    far = torch.tensor([1, 5])  # NOTE: (0, 5) is offset 5, inside the 12 elements
    with pytest.raises(IndexError):
        x[i, far]
    with pytest.raises(IndexError):
        fn(x, i, far)


def test_index_tensors_apart_stay_an_opaque_node() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return x[i, :, j] * 2

    compiled = plait.compile(fn)
    x = torch.randn(3, 4, 5)
    i, j = torch.tensor([0, 2]), torch.tensor([4, 1])
    with pytest.warns(CaptureFallbackWarning, match="opaque"):
        got = compiled(x, i, j)
    assert_bitwise(got, fn(x, i, j))


def test_index_tensors_on_a_symbolic_dim_run_eagerly_with_a_warning() -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return x[i, j] * 2

    compiled = plait.compile(fn, dynamic=True)
    for n in (5, 7, 9):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, n + 1, generator=g)
        i, j = _ints(g, n, (3,)), _ints(g, n + 1, (3,))
        if n == 5:
            with pytest.warns(CaptureFallbackWarning, match="symbolic dim"):
                got = compiled(x, i, j)
        else:
            got = compiled(x, i, j)
        assert_bitwise(got, fn(x, i, j))

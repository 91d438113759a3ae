"""``torch.gather`` and ``take_along_dim`` whose index has symbolic dims (BERT's token-type
ids: a static buffer gathered at ``position_ids`` of the sequence's length) compile with
``dynamic=True`` into one specialization that answers as eager at every size; a source of
symbolic dims is still a limitation (its strides are products of its dims)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning

SIZES = (5, 9, 3, 12, 7)


Make = Callable[[int], tuple[torch.Tensor, ...]]


def _judge(fn: Callable[..., torch.Tensor], make: Make) -> None:
    compiled = plait.compile(fn, dynamic=True, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        for seed, n in enumerate(SIZES):
            torch.manual_seed(seed)
            args = make(n)
            assert torch.equal(compiled(*args), fn(*args)), n
    assert len(compiled.specializations) == 1


class _Table(torch.nn.Module):
    """A static source (a buffer), gathered at a symbolic index."""

    def __init__(self, rows: int, cols: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(rows, cols))
        self.dim = dim

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return torch.gather(self.table, self.dim, index) + 1


def test_bert_token_types_gathered_at_positions() -> None:
    table = torch.randn(1, 64)

    def fn(ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        buffered = table.expand(positions.shape[0], -1)
        return ids * torch.gather(buffered, dim=1, index=positions)

    _judge(fn, lambda n: (torch.randn(3, n),))


@pytest.mark.parametrize("dim", [0, 1])
def test_gather_from_a_buffer_at_a_symbolic_index(dim: int) -> None:
    model = _Table(6, 8, dim)
    bound = (6, 8)[dim]
    _judge(model, lambda n: (torch.randint(0, bound, (n, 8) if dim == 0 else (6, n)),))


def test_take_along_dim_with_a_symbolic_index() -> None:
    table = torch.randn(1, 10)
    fn = lambda i: torch.take_along_dim(table, i, dim=1) * 3
    _judge(fn, lambda n: (torch.randint(0, 10, (1, n)),))


def test_an_index_out_of_range_raises_as_eager() -> None:
    model = _Table(3, 8, 1)
    compiled = plait.compile(model, dynamic=True, options={"cache": False})
    for n in (4, 6):
        i = torch.randint(0, 8, (3, n))
        assert torch.equal(compiled(i), model(i))
    bad = torch.full((3, 5), 8)
    with pytest.raises((IndexError, RuntimeError)):
        model(bad)
    with pytest.raises((IndexError, RuntimeError)):
        compiled(bad)

"""A program whose outputs are its inputs or views of them exports, verifies and, loaded, hands
back those outputs aliasing the call's inputs as eager PyTorch does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import plait
from tests.export.models import seeded


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _transposed(x: torch.Tensor) -> torch.Tensor:
    return x.t()


def _slices_and_a_sum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x[1:], x[:, 1], x.sum(0)


@pytest.mark.parametrize(
    "fn", [_identity, _transposed, _slices_and_a_sum], ids=lambda f: f.__name__
)
def test_outputs_that_are_inputs_or_their_views_export_verify_and_alias(
    fn: Any, tmp_path: Path
) -> None:
    gen = seeded(21)
    path = plait.export(fn, (torch.randn(3, 4, generator=gen),), native=False).save(
        tmp_path / "alias.plait"
    )
    assert plait.verify(path).ok
    loaded = plait.load(path)
    x = torch.randn(3, 4, generator=gen)
    got, want = loaded(x), fn(x)
    got_leaves = got if isinstance(got, tuple) else (got,)
    want_leaves = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got_leaves, want_leaves):
        assert torch.equal(g, w)
        same_memory = g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert same_memory == (w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())

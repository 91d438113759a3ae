"""Writes through the views that diagonal, movedim, mH, atleast_*d, broadcast_to and strided
slices return, and updates of their base, are functionalized as eager aliases them: the compiled
program's outputs and the mutated inputs equal eager's bitwise, on fresh inputs. A write through
an ``unfold`` window (which may overlap) is refused loudly."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import GraphCaptureError
from tests.util import assert_bitwise


def _diagonal_add(x: torch.Tensor) -> torch.Tensor:
    x.diagonal().add_(1)
    return x * 2


def _diagonal_fill_offset(x: torch.Tensor) -> torch.Tensor:
    x.diagonal(1, 2, 0).fill_(3.5)
    return x + 1


def _diagonal_of_a_copy(x: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y.diagonal(-1, -1, -2).mul_(2)
    return y


def _diagonal_after_base_update(x: torch.Tensor) -> torch.Tensor:
    d = x.diagonal(-2)
    x.mul_(3)
    return d + 0


def _movedim_adjoint_atleast(x: torch.Tensor) -> torch.Tensor:
    torch.movedim(x, 0, 2).add_(1)
    x.mH.mul_(2)
    torch.atleast_3d(x[0, 0]).sub_(1)
    return x * 1


def _broadcast_after_base_update(x: torch.Tensor) -> torch.Tensor:
    b = torch.broadcast_to(x[:, :1], (2, *x[:, :1].shape))
    x.add_(1)
    return b * 2


def _strided_slice_writes(x: torch.Tensor) -> torch.Tensor:
    x[::2] = 0.5
    x[:, 1:7:3] += 1
    x[..., -5::2].mul_(-1)
    x[1:2:5] = 1
    return x * 2


PROGRAMS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[int, ...]]] = {
    "diagonal_add": (_diagonal_add, (4, 5)),
    "diagonal_fill_offset": (_diagonal_fill_offset, (3, 4, 5)),
    "diagonal_of_a_copy": (_diagonal_of_a_copy, (2, 3, 4)),
    "diagonal_after_base_update": (_diagonal_after_base_update, (5, 3)),
    "movedim_adjoint_atleast": (_movedim_adjoint_atleast, (2, 3, 4)),
    "broadcast_after_base_update": (_broadcast_after_base_update, (3, 4, 2)),
    "strided_slice_writes": (_strided_slice_writes, (5, 8)),
}


@pytest.mark.parametrize("backend", ["eager", "stax"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_write_through_a_view_matches_eager(name: str, backend: str) -> None:
    fn, shape = PROGRAMS[name]
    compiled = plait.compile(fn, backend=backend, fullgraph=True)
    for seed in (0, 1, 2):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        ours, theirs = x.clone(), x.clone()
        got, want = compiled(ours), fn(theirs)
        assert_bitwise(got, want, f"{name} output, draw {seed}")
        assert_bitwise(ours, theirs, f"{name} mutated input, draw {seed}")
    spec = compiled.specializations[0]
    assert spec.graph is not None and spec.fallback_reason is None
    assert not [n for n in spec.graph.nodes if n.op == "opaque"]


def test_write_through_an_unfold_window_is_refused_loudly() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.unfold(1, 2, 2).add_(1)
        return x

    compiled = plait.compile(fn, fullgraph=True)
    with pytest.raises(GraphCaptureError, match="unfold"):
        compiled(torch.randn(3, 4))

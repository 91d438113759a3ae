"""Split sizes, sections or indices a program computes from another input's size
(``x.split([y.shape[0], ...])``, ``x.tensor_split(y.shape[0])``, ``torch.hsplit(x, [n])``) are
guarded: the pieces are cut at the sizes eager's results had at capture, so the size that chose
them must hold on a later call. Before, ``y``'s size stayed symbolic behind only its ``>= 2``
guard, and a call with another ``y`` got the capture's pieces (``[4, 3]`` where eager splits
``[7, 0]``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise

# NOTE: (x columns, y length): the second call makes x's columns static and y symbolic
CALLS = ((6, 3), (7, 4), (7, 7), (7, 2), (9, 4), (7, 5), (8, 2))

CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], list[torch.Tensor]]] = {
    "split_sizes": lambda x, y: [t * 2 for t in x.split([y.shape[0], x.shape[1] - y.shape[0]], 1)],
    "split_size": lambda x, y: [t * 2 for t in x.split(y.shape[0], 1)],
    "tensor_split_sections": lambda x, y: [t * 2 for t in x.tensor_split(y.shape[0], 1)],
    "tensor_split_indices": lambda x, y: [t * 2 for t in x.tensor_split([1, y.shape[0]], 1)],
    "hsplit": lambda x, y: [t * 2 for t in torch.hsplit(x, [y.shape[0]])],
}


@pytest.mark.parametrize("dynamic", [True, None])
@pytest.mark.parametrize("name", sorted(CASES))
def test_split_pieces_follow_the_sizes_that_chose_them(name: str, dynamic: bool | None) -> None:
    fn = CASES[name]
    compiled = plait.compile(fn, dynamic=dynamic, options={"cache": False, "recompile_limit": 20})
    for seed, (a, b) in enumerate(CALLS):
        torch.manual_seed(seed)
        x, y = torch.randn(3, a), torch.randn(b)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            got = compiled(x, y)
        want = fn(x, y)
        assert len(got) == len(want), f"{name} at {(a, b)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_bitwise(g, w, f"{name} at {(a, b)}, piece {i}")

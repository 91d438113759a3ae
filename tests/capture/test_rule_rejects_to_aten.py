"""A call whose capture rule has no IR form for it (an IR op's type rule rejects the rule's call,
or the rule says so) goes to the ATen path as a call with no rule would: eager accepted it, so
it becomes typed nodes, never a whole-program fallback. Compared with eager on fresh draws,
within the numerical contract."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.contract

TOL = plait.contract.load()


def _draw(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# name: (program, argument shapes): each is valid PyTorch that the conv2d rule does not lower
CASES: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "unbatched_conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, stride=(2, 2), padding=2),
        [(3, 4, 4), (3, 3, 3, 3), (3,)],
    ),
    "same_padding_even_kernel": (
        lambda x, w: F.conv2d(x, w, padding="same"),
        [(2, 3, 6, 6), (4, 3, 2, 2)],
    ),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("name", sorted(CASES))
def test_rejected_rule_call_compiles_through_aten(name: str) -> None:
    fn, shapes = CASES[name]
    compiled = plait.compile(fn, fullgraph=True)
    tol = TOL.tolerance("conv", torch.float32)
    for seed in (0, 10, 20):  # NOTE: the capture draw, then two fresh ones
        args = [_draw(s, seed + i) for i, s in enumerate(shapes)]
        with torch.no_grad():
            got, want = compiled(*args), fn(*args)
        assert got.shape == want.shape
        scale = max(1.0, float(want.abs().max()))
        assert bool(((got - want).abs() <= tol.atol * scale + tol.rtol * want.abs()).all())
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None and spec.opaque_counts == {}
    assert spec.manifest.fallbacks == []

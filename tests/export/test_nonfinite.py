"""A program whose outputs hold NaN on valid inputs (a log of a negative number) exports, and the
loaded program reproduces the compiled program's outputs bit for bit, NaN where it is NaN."""

from __future__ import annotations

from pathlib import Path

import torch

import plait
from tests.export.models import seeded
from tests.util import contract_tol


def _logs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.log(), x.exp()


def test_a_program_with_nan_outputs_exports_and_verifies_bit_for_bit(tmp_path: Path) -> None:
    gen = seeded(51)
    path = plait.export(_logs, (torch.randn(16, generator=gen),), native=False).save(
        tmp_path / "logs.plait"
    )
    verification = plait.verify(path)
    assert verification.ok and verification.bitwise_as_exported
    loaded = plait.load(path)
    x = torch.randn(16, generator=gen)
    got, want = loaded(x), _logs(x)
    assert bool(want[0].isnan().any())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, **contract_tol("model", torch.float32))

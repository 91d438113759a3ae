"""The export stores enough reference cases for every value the gate judges: outputs, and the
inputs it checks after the call (a 0-d input gives one error sample per case)."""

from __future__ import annotations

from pathlib import Path

import torch

import plait
from tests.export.models import seeded
from tests.util import contract_tol


def _scaled_by(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x * s


def test_a_program_with_a_0d_input_exports_and_verifies(tmp_path: Path) -> None:
    gen = seeded(31)
    example = (torch.randn(3, generator=gen), torch.randn((), generator=gen))
    path = plait.export(_scaled_by, example, native=False).save(tmp_path / "scaled.plait")
    assert plait.verify(path).ok
    loaded = plait.load(path)
    for _ in range(3):
        x, s = torch.randn(3, generator=gen), torch.randn((), generator=gen)
        torch.testing.assert_close(
            loaded(x, s), _scaled_by(x, s), **contract_tol("model", torch.float32)
        )


def _sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sum(0), x * 2


def test_a_program_of_empty_inputs_exports_and_verifies(tmp_path: Path) -> None:
    """Empty inputs are the same on every draw: there is nothing to draw, and nothing repeats."""
    path = plait.export(_sums, (torch.randn(0, 4),), native=False).save(tmp_path / "empty.plait")
    assert plait.verify(path).ok
    total, doubled = plait.load(path)(torch.randn(0, 4))
    assert torch.equal(total, torch.zeros(4)) and doubled.shape == (0, 4)


def _by_layout(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0 if x.is_contiguous(memory_format=torch.channels_last) else x - 1.0


def test_a_channels_last_program_is_judged_in_channels_last(tmp_path: Path) -> None:
    """The gate judges an artifact on its stored cases as they are laid out (channels-last,
    as the example): a program that reads its input's layout exports and verifies (the gate
    made the cases contiguous, which the layout guard refuses: the export failed the gate)."""
    gen = seeded(32)
    example = torch.randn(2, 3, 4, 5, generator=gen).to(memory_format=torch.channels_last)
    artifact = plait.export(_by_layout, (example,), native=False)
    assert "layout channels_last" in str(artifact.verdict)
    path = artifact.save(tmp_path / "by_layout.plait")
    result = plait.verify(path)
    assert result.ok and "layout channels_last" in str(result)
    loaded = plait.load(path)
    x = torch.randn(2, 3, 4, 5, generator=gen).to(memory_format=torch.channels_last)
    torch.testing.assert_close(loaded(x), _by_layout(x), **contract_tol("model", torch.float32))

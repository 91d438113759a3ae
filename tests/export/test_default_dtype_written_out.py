"""A program exported under ``torch.set_default_dtype(torch.float64)`` states the dtypes the
default gave (integer true division, an integer tensor times a float, a factory without
``dtype=``) in its IR: loaded and called under float32, it computes eager's float64 results."""

from __future__ import annotations

from pathlib import Path

import torch

import plait
from tests.export.models import seeded
from tests.util import assert_bitwise


def _fn(i: torch.Tensor) -> torch.Tensor:
    return i / 7 + i * 0.1 + torch.linspace(0, 1, 6)


def test_exported_under_float64_default_runs_as_float64_under_float32(tmp_path: Path) -> None:
    gen = seeded(5)
    draws = [torch.randint(-1000, 1000, (6,), generator=gen) for _ in range(3)]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        path = plait.export(_fn, (draws[0],), native=False).save(tmp_path / "f64.plait")
        wants = [_fn(i) for i in draws]
    finally:
        torch.set_default_dtype(before)
    assert torch.get_default_dtype() == torch.float32
    assert plait.verify(path).ok
    loaded = plait.load(path)
    for n, (i, want) in enumerate(zip(draws, wants)):
        assert want.dtype == torch.float64
        assert_bitwise(loaded(i), want, f"draw {n}")

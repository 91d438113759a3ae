"""Two inputs that share memory through storages of their own (``torch.from_numpy`` of two
overlapping slices of one array, ``torch.frombuffer``): the alias guard compared the addresses
where their storages start, found them apart, and served a program that writes one and reads
the other, which read the other's value from before the write. Such a call is refused loudly
(eager runs it, warned); inputs from one array that share no byte still compile."""

from __future__ import annotations

import warnings

import numpy as np
import torch

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import assert_bitwise


def _writes_x_reads_y(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(1.0)
    return y * 2.0


def _pair(seed: int, overlap: bool) -> tuple[torch.Tensor, torch.Tensor]:
    a = np.random.RandomState(seed).randn(8).astype(np.float32)
    return (torch.from_numpy(a[:4]), torch.from_numpy(a[2:6] if overlap else a[4:]))


def test_inputs_overlapping_in_separate_storages_are_refused_loudly() -> None:
    compiled = plait.compile(_writes_x_reads_y, options={"cache": False})
    for seed, overlap in enumerate((False, True, True, False)):
        got_in, want_in = _pair(seed, overlap), _pair(seed, overlap)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.no_grad():
                got = compiled(*got_in)
        want = _writes_x_reads_y(*want_in)
        assert_bitwise(got, want, f"call {seed}: output")
        for k, (a, b) in enumerate(zip(got_in, want_in)):
            assert_bitwise(a, b, f"call {seed}: input {k} after the call")
        warned = any(issubclass(w.category, CaptureFallbackWarning) for w in caught)
        assert warned == (overlap and seed == 1), f"call {seed}"
    assert compiled.specializations[0].executor is not None

"""``dynamic=True`` asks for symbolic sizes: an export whose capture had to make an input's size
static says so, with which sizes and why, and the loaded program refuses other sizes clearly."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from plait.errors import CompiledInputError, ExportWarning
from tests.export.models import seeded
from tests.util import contract_tol


def test_a_batch_size_equal_to_a_weight_size_is_made_static_loudly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    gen = seeded(41)
    with pytest.warns(ExportWarning, match=r"every input size static.*input\.shape\[0\]"):
        artifact = plait.export(model, (torch.randn(4, 6, generator=gen),), dynamic=True)
    loaded = plait.load(artifact.save(tmp_path / "static.plait"))
    x = torch.randn(4, 6, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), **contract_tol("model", torch.float32))
    with pytest.raises(CompiledInputError, match=r"expected f32\[4, 6\]"):
        loaded(torch.randn(5, 6, generator=gen))


def test_a_dynamic_export_with_symbolic_sizes_does_not_warn() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        artifact = plait.export(model, (torch.randn(5, 6, generator=seeded(42)),), dynamic=True)
    assert "f32[s0, 6]" in artifact.members["program.ir"].decode()

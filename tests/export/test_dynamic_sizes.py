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


def test_sizes_equal_to_the_channels_a_rule_refuses_are_made_static_loudly(tmp_path: Path) -> None:
    """Every input size equals the convolution's 3 input channels, which its rule refuses as a
    symbol: all are made static, and the export says so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    gen = seeded(41)
    with pytest.warns(ExportWarning, match=r"every input size static.*input\.shape\[0\]"):
        artifact = plait.export(model, (torch.randn(3, 3, 3, 3, generator=gen),), dynamic=True)
    loaded = plait.load(artifact.save(tmp_path / "static.plait"))
    x = torch.randn(3, 3, 3, 3, generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), **contract_tol("model", torch.float32))
    with pytest.raises(CompiledInputError, match=r"expected f32\[3, 3, 3, 3\]"):
        loaded(torch.randn(5, 3, 3, 3, generator=gen))


def test_a_batch_size_equal_to_a_weight_size_stays_symbolic(tmp_path: Path) -> None:
    """The batch equals the first linear's 4 outputs, which no rule refuses: it stays a symbol
    (only the sizes a refusing rule names are made static)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    gen = seeded(41)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        artifact = plait.export(model, (torch.randn(4, 6, generator=gen),), dynamic=True)
    assert "f32[s0, 6]" in artifact.members["program.ir"].decode()
    loaded = plait.load(artifact.save(tmp_path / "symbolic.plait"))
    with torch.no_grad():
        for batch in (4, 5):
            x = torch.randn(batch, 6, generator=gen)
            torch.testing.assert_close(loaded(x), model(x), **contract_tol("model", torch.float32))


def test_a_dynamic_export_with_symbolic_sizes_does_not_warn() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        artifact = plait.export(model, (torch.randn(5, 6, generator=seeded(42)),), dynamic=True)
    assert "f32[s0, 6]" in artifact.members["program.ir"].decode()

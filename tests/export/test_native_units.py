"""An export carries its program's kernel libraries even when this process loaded them from
somewhere the kernel cache no longer points to (a trusted artifact's adopted units, a cache
directory changed or cleared since): the missing units are built into the cache."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from plait.errors import ExportWarning


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * x + 1.5


def _unit_keys(artifact: object) -> list[str]:
    index = json.loads(artifact.members["native/index.json"])  # type: ignore[attr-defined]
    return sorted(u["key"] for u in index["units"])


def test_an_export_builds_units_loaded_from_another_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _Net().eval()
    x = torch.randn(3, 12)
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path / "first"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportWarning)
        first = plait.export(model, (x,))
    assert first.native, first.header["native_note"]
    # NOTE: the units stay loaded in this process; the kernel cache now points elsewhere
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path / "second"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportWarning)
        second = plait.export(model, (x,))
    assert second.native, second.header["native_note"]
    assert _unit_keys(second) == _unit_keys(first)
    assert list((tmp_path / "second").rglob("*.so"))

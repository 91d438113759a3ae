"""A value the program reads from a module it imports inside its own code (``from cfg import
SCALE`` or ``import cfg as C; C.SCALE`` in ``forward``) is guarded like a global's.

The import binds a local, so no global load or closure named the module: capture read the value
and guarded nothing, and a call after ``cfg.SCALE = 5.0`` was served the program compiled with
the old value, silently. The modules code imports as it runs are now hosts of the names it uses,
as the modules its globals name are."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

CONFIG = "plait_test_forward_config"  # NOTE: written by each test; its values set before use


class FromImport(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from plait_test_forward_config import SCALE  # type: ignore[import-not-found]

        return self.lin(x) * SCALE


class ModuleImport(FromImport):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import plait_test_forward_config as cfg  # type: ignore[import-not-found]

        return self.lin(x) * cfg.SCALE + cfg.SHIFT


@pytest.mark.parametrize("cls", [FromImport, ModuleImport], ids=["from-import", "module-import"])
def test_a_value_of_a_module_imported_in_forward_is_guarded(
    cls: type[nn.Module], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / f"{CONFIG}.py").write_text("SCALE = 2.0\nSHIFT = 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = importlib.import_module(CONFIG)
    config.SCALE, config.SHIFT = 2.0, 0.5
    torch.manual_seed(0)
    model = cls().eval()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    for k, scale in enumerate((2.0, 5.0, 2.0, -1.5)):
        config.SCALE = scale
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(k))
        with torch.no_grad():
            torch.testing.assert_close(
                compiled(x), model(x), **contract_tol("matmul", torch.float32)
            )
    reasons = " ".join(str(r) for r in compiled.recompile_reasons)
    assert f"{CONFIG}.SCALE" in reasons, reasons

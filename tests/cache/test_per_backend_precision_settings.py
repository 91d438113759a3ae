"""Programs compiled under PyTorch's per-backend ``fp32_precision`` settings: a setting that
makes PyTorch's legacy reads raise (``torch.get_float32_matmul_precision()``, the cuDNN TF32
flag) compiles and answers like eager, and an entry compiled under one setting is never served
under another."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol, set_backend_flag

SETTINGS = {
    "mkldnn.matmul bf16": (torch.backends.mkldnn.matmul, "bf16"),
    "mkldnn bf16": (torch.backends.mkldnn, "bf16"),
    "mkldnn.matmul tf32": (torch.backends.mkldnn.matmul, "tf32"),
}


@pytest.fixture
def restore_precision() -> Iterator[None]:
    saved = [(obj, obj.fp32_precision) for obj, _ in SETTINGS.values()]
    legacy = torch._C._get_float32_matmul_precision()
    try:
        yield
    finally:
        for obj, value in reversed(saved):
            set_backend_flag(obj, "fp32_precision", value)
        torch.set_float32_matmul_precision(legacy)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)).eval()


def _call(model: nn.Module, cache: Path, seed: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    compiled = plait.compile(model, options={"cache": str(cache)})
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out, expected = compiled(x), model(x)
    return out, expected, str(compiled.specializations[-1].manifest.cache.get("status"))


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_per_backend_precision_compiles_and_is_keyed(
    tmp_path: Path, setting: str, restore_precision: None
) -> None:
    obj, value = SETTINGS[setting]
    model = _mlp()
    _call(model, tmp_path, 1)  # NOTE: the default setting fills the cache
    set_backend_flag(obj, "fp32_precision", value)
    out, expected, status = _call(model, tmp_path, 2)
    torch.testing.assert_close(out, expected, **contract_tol("matmul", torch.float32))
    assert status == "miss"
    _, _, again = _call(model, tmp_path, 3)
    assert again == "hit"

"""Calls captured without a rule of their own (ATen programs, opaque nodes) under
``torch.autocast``: their operands are what autocast gave the kernel, as a rule's are.

The compiled program runs with autocast off, so autocast's casts must be in the graph: an op on
autocast's float32 list (``linalg.svdvals``, ``stft``, ``binary_cross_entropy_with_logits``) reads
float32 operands where the program passes bfloat16 ones. ``nn.TransformerEncoderLayer`` takes
PyTorch's fast path under the CPU's autocast (its check reads CUDA's only), whose result is
bfloat16 where the slow path ends in float32: that call runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from tests.util import contract_tol

W = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))

CALLS: dict[str, Callable[..., torch.Tensor]] = {
    "svdvals": lambda x, y: torch.linalg.svdvals(x @ W),
    "stft": lambda x, y: torch.stft((x @ W).reshape(-1), 16, return_complex=True).abs(),
    "bce_with_logits": lambda x, y: F.binary_cross_entropy_with_logits(x @ W, y, reduction="none"),
}


def _draw(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 8, generator=g) * 3, torch.rand(8, 8, generator=g)


# NOTE: stft and binary_cross_entropy_with_logits are opaque nodes (warned), svdvals an ATen program
@pytest.mark.filterwarnings("ignore::plait.errors.CaptureFallbackWarning")
@pytest.mark.parametrize("name", list(CALLS))
def test_autocast_float32_ops_without_rules_match_eager(name: str) -> None:
    f = CALLS[name]
    compiled = plait.compile(f, options={"cache": False})
    for seed in (1, 2, 3):
        x, y = _draw(seed)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want, got = f(x, y), compiled(x, y)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, **contract_tol("pointwise", want.dtype))


def test_transformer_layer_under_cpu_autocast_has_eager_dtype() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).eval()
    compiled = plait.compile(layer, options={"cache": False})
    for seed in (4, 5, 6):
        x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(seed))
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            want, got = layer(x), compiled(x)
        assert got.dtype == want.dtype == torch.bfloat16
        assert torch.equal(got, want)

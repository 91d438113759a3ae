"""Calls that name their arguments by PyTorch's parameter names compile and match eager on fresh
inputs: capture rules name their parameters for their own use (``batch1`` is ``a`` in
baddbmm's), so the call's keywords are placed by PyTorch's signatures before the rule reads
them; ``out=None`` is no output tensor. BLOOM's attention, ``alibi.baddbmm(batch1=q,
batch2=k, beta=b, alpha=a)``, raised ``TypeError`` from the rule before."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

F = torch.nn.functional
_TOL = contract_tol("model", torch.float32)

CALLS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Tensor.baddbmm": lambda x, y: x.baddbmm(batch1=y, batch2=y.transpose(1, 2), beta=0.5),
    "torch.baddbmm": lambda x, y: torch.baddbmm(x, batch1=y, batch2=y.mT, alpha=2.0),
    "torch.add other": lambda x, y: torch.add(x, other=x, alpha=3),
    "torch.add input": lambda x, y: torch.add(input=x, other=x),
    "torch.add out=None": lambda x, y: torch.add(x, x, out=None),
    "Tensor.add other": lambda x, y: x.add(other=x, alpha=2),
    "torch.matmul other": lambda x, y: torch.matmul(y, other=y.mT),
    "Tensor.bmm mat2": lambda x, y: y.bmm(mat2=y.mT),
    "torch.pow exponent": lambda x, y: torch.pow(x, exponent=2),
    "torch.where": lambda x, y: torch.where(condition=x > 0, input=x, other=-x),
    "torch.clamp_min": lambda x, y: torch.clamp_min(x, min=0.1),
    "torch.tile": lambda x, y: torch.tile(x, dims=(2,)),
    "Tensor.div": lambda x, y: x.div(other=0.7, rounding_mode="floor"),
    "F.linear": lambda x, y: F.linear(input=y, weight=y[0], bias=None),
    "F.gelu": lambda x, y: F.gelu(input=x, approximate="tanh"),
    "F.sdpa": lambda x, y: F.scaled_dot_product_attention(query=y, key=y, value=y),
    "torch.sum": lambda x, y: torch.sum(input=x, dim=1),
    "torch.max dim": lambda x, y: torch.max(input=x, dim=1).values,
    "torch.softmax": lambda x, y: torch.softmax(input=x, dim=1),
    "torch.transpose": lambda x, y: torch.transpose(input=x, dim0=0, dim1=2),
    "torch.reshape": lambda x, y: torch.reshape(input=x, shape=(-1, 3)),
    "torch.masked_fill": lambda x, y: torch.masked_fill(input=x, mask=x > 0, value=0.5),
    "torch.gather": lambda x, y: torch.gather(input=x, dim=2, index=(x > 0).long()),
    "torch.full_like": lambda x, y: torch.full_like(input=x, fill_value=3.0) * x,
    "torch.cumsum out=None": lambda x, y: torch.cumsum(x, 1, out=None),
    "torch.outer": lambda x, y: torch.outer(x[0, 0], vec2=x[1, 1]),
    "deprecated add(x, alpha, other)": lambda x, y: torch.add(x, 2.0, x),
}


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, 3, generator=g), torch.randn(2, 3, 3, generator=g)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_keyword_call_matches_eager(name: str) -> None:
    fn = CALLS[name]
    compiled = plait.compile(fn, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # NOTE: the deprecated overload's
        for seed in range(3):
            x, y = _inputs(seed)
            torch.testing.assert_close(compiled(x, y), fn(x, y), **_TOL)


class _AlibiAttention(nn.Module):
    """BLOOM's attention scores: ``alibi.baddbmm`` with every operand by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor, alibi: torch.Tensor) -> torch.Tensor:
        q, k = self.qk(x).chunk(2, dim=-1)
        scores = alibi.baddbmm(batch1=q, batch2=k.transpose(-1, -2), beta=1.0, alpha=0.125)
        return scores.softmax(-1) @ x


def test_alibi_baddbmm_by_keyword_compiles_whole_and_matches_eager() -> None:
    torch.manual_seed(0)
    model = _AlibiAttention().eval()
    compiled = plait.compile(model)
    for seed in range(3):
        g = torch.Generator().manual_seed(10 + seed)
        x, alibi = torch.randn(2, 5, 8, generator=g), torch.randn(2, 1, 5, generator=g)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, alibi), model(x, alibi), **_TOL)
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None, spec.fallback_reason
    assert not any(str(f.get("what", "")).startswith("opaque") for f in spec.manifest.fallbacks)

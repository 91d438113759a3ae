"""Rotary position embeddings written with complex numbers (Meta's Llama reference code:
``view_as_complex`` of the reshaped query, times ``polar`` frequencies, ``view_as_real``) compile
and match eager. The ATen path made a fake tensor of the complex view by replaying its views on
its real base, which PyTorch refuses: the compiled call raised where eager runs."""

from __future__ import annotations

import warnings

import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol


class ComplexRotary(nn.Module):
    def __init__(self, heads: int = 2, dim: int = 8, length: int = 6) -> None:
        super().__init__()
        self.heads, self.dim = heads, dim
        freqs = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(length).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))
        self.proj = nn.Linear(heads * dim, heads * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.proj(x).view(b, t, self.heads, self.dim)
        q_c = torch.view_as_complex(q.float().reshape(b, t, self.heads, -1, 2))
        rotated = q_c * self.freqs_cis[:t].view(1, t, 1, -1)
        return torch.view_as_real(rotated).flatten(3).type_as(x)


def test_complex_rotary_embedding_matches_eager_on_fresh_inputs() -> None:
    model = ComplexRotary().eval()
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    for seed in range(3):
        x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", CaptureFallbackWarning)  # NOTE: complex: opaque
            got, want = compiled(x), model(x)
        torch.testing.assert_close(got, want, **contract_tol("matmul", torch.float32))
    assert not any(s.fallback_reason for s in compiled.specializations)

"""A module that memoizes a tensor in a dict it reads (timm's LeViT and EfficientFormer fill
``self.attention_bias_cache[str(device)]`` on their first eval call) is refused by capture (the
program changes a value it reads) and runs eagerly. The tracer the capture stored in the dict is
taken out again, so the eager run fills the memo with eager's tensor: every call matches eager.
Before, the memo kept the capture's tracer, and every later call of the model (compiled, eager
fallback, or the module called directly) raised "kept in Python state"."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


class MemoBias(nn.Module):
    """A conv (capture skips its arithmetic), then attention logits plus a bias gathered from a
    table and memoized per device in eval mode, as LeViT's ``get_attention_biases``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.biases = nn.Parameter(torch.randn(2, 7))
        self.register_buffer("idxs", torch.randint(0, 7, (16, 16)), persistent=False)
        self.bias_cache: dict[str, torch.Tensor] = {}

    def biases_for(self, device: torch.device) -> torch.Tensor:
        if self.training:
            return self.biases[:, self.idxs]
        key = str(device)
        if key not in self.bias_cache:
            self.bias_cache[key] = self.biases[:, self.idxs]
        return self.bias_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.conv(x).flatten(2)  # NOTE: (B, 8, 16) tokens of a 4 x 4 image
        q = t.view(t.shape[0], 2, 4, 16).transpose(-1, -2)
        attn = q @ q.transpose(-1, -2) * 0.5 + self.biases_for(x.device)
        return attn.softmax(-1) @ q


def test_a_memoized_tensor_matches_eager_on_every_call() -> None:
    torch.manual_seed(0)
    model = MemoBias().eval()
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for batch in (2, 3, 1):
            x = torch.randn(batch, 3, 4, 4, generator=gen)
            torch.testing.assert_close(compiled(x), reference(x), **TOL)
    assert [type(t) for t in model.bias_cache.values()] == [torch.Tensor]
    torch.testing.assert_close(model.bias_cache["cpu"], reference.bias_cache["cpu"], **TOL)
    with torch.no_grad():
        x = torch.randn(2, 3, 4, 4, generator=gen)
        torch.testing.assert_close(model(x), reference(x), **TOL)  # NOTE: the module itself too

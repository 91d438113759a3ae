"""An opaque node's result (torch.addmm has no IR op: HF GPT-2's Conv1D) viewed and transposed
into scaled_dot_product_attention: the planner's layout dry run of the attention extern needs a
sample of the opaque node's result (it raised KeyError in the dry run's ``_operand_sample``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from tests.capture.helpers import opaque_path  # noqa: F401  (fixture)
from tests.codegen.stax_helpers import stax_cache  # noqa: F401  (the fixture)
from tests.util import assert_bitwise


class QKV(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.randn(32))
        self.w = nn.Parameter(torch.randn(16, 32))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q = torch.addmm(self.b, h.view(-1, 16), self.w).view(2, 4, 2, 16).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q)


@pytest.mark.usefixtures("stax_cache", "opaque_path")  # NOTE: addmm kept opaque (no ATen trace)
@pytest.mark.filterwarnings("ignore::plait.errors.CaptureFallbackWarning")
def test_opaque_result_viewed_into_attention() -> None:
    torch.manual_seed(0)
    model = QKV().eval()
    # NOTE: the product stays PyTorch's (plait's native kernel, which runs a linear of few rows
    # with its own order of sums, off): the bits below are eager's
    cf = plait.compile(model, backend="stax", options={"stax": {"pointwise": False}})
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for _ in range(3):
            h = torch.randn(2, 4, 16, generator=gen)
            # NOTE: addmm (opaque) and attention (extern) are PyTorch's own kernels on the same
            # values: the same bits.
            assert_bitwise(cf(h), model(h), "attention of an opaque result")

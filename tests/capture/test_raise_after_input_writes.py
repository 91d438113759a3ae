"""A program that raises its own error after writing a tensor of the call in place leaves the
write in the caller's tensor, as eager does: capture wrote its clones, so the caller's input (or
the module's buffer) came back unwritten while eager's was written, silently where the caller
catches the error. Such a call runs eagerly (a recorded fallback)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import plait
from tests.util import assert_bitwise


def _add_then_flatten(x: torch.Tensor) -> torch.Tensor:
    x.add_(1)
    return x.view(-1)  # NOTE: eager refuses a transposed x here, after the write


def _outcome(fn, x: torch.Tensor) -> str:
    try:
        fn(x)
    except RuntimeError:
        return "raised"
    return "returned"


def test_a_view_refused_after_a_write_leaves_the_write_in_the_input() -> None:
    compiled = plait.compile(_add_then_flatten, options={"cache": False})
    gen = torch.Generator().manual_seed(0)
    with pytest.warns(plait.errors.CaptureFallbackWarning, match="after writing x in place"):
        for transposed in (False, True, False, True):
            x = torch.randn(6, 4, generator=gen)
            x = x.t() if transposed else x.t().contiguous()
            eager_x = x.clone() if not transposed else x.t().clone().t()
            assert _outcome(compiled, x) == _outcome(_add_then_flatten, eager_x)
            assert x.stride() == eager_x.stride()
            assert_bitwise(x, eager_x, "the input after the call")


class _Counts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x.sum(0))
        if x.shape[0] > 2:
            raise ValueError("too many rows")
        return self.seen * 2


def test_a_buffer_written_before_the_programs_error_keeps_the_write() -> None:
    model, reference = _Counts(), _Counts()
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), pytest.warns(plait.errors.CaptureFallbackWarning):
        for rows in (2, 3, 2, 3):
            x = torch.randn(rows, 3, generator=gen)
            for m in (compiled, reference):
                with contextlib.suppress(ValueError):
                    m(x)
            assert_bitwise(model.seen, reference.seen, f"the buffer after {rows} rows")

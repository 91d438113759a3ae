"""The GPU tests judge IEEE float32: the contract (and the gate's settings check) refuses calls
that ran with TF32 matrix products, which PyTorch turns on for cuDNN by default."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _ieee_float32() -> Iterator[None]:
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags

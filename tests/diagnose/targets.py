"""Programs for ``plait diagnose MODULE:FUNCTION`` in the CLI tests."""

from __future__ import annotations

import torch

from tests.diagnose.test_bisect_seeded import SigmoidMLP


def sigmoid_mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return SigmoidMLP().eval(), (torch.randn(4, 16),)

"""Module-level state the tests of tests/capture/test_python_state_guards.py change between calls
(globals of another module, read by name and through the module)."""

from __future__ import annotations

import torch

SHIFT = 0.25
FLAGS = {"double": False}


def shifted(x: torch.Tensor) -> torch.Tensor:
    return x + SHIFT

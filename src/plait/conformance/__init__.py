"""plait.conformance: the gate that judges compiled programs, independent of the compiler.

It imports PyTorch, the standard library and :mod:`plait.contract`, and nothing else of plait
(an import-linter contract and tests/conformance enforce it). See docs/conformance.md.

Example:
    >>> import torch, plait.conformance
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    >>> wrong = lambda x: torch.relu(x @ model[0].weight + model[0].bias)  # transposed weight
    >>> report = plait.conformance.check(model, wrong, (torch.randn(4, 8),), candidate_module=model)
    >>> report.ok
    False
"""

from __future__ import annotations

from plait.conformance.compare import Budget, unit_roundoff
from plait.conformance.draws import LAYOUTS, draw_like
from plait.conformance.gate import check
from plait.conformance.gradcheck import gradcheck_fd
from plait.conformance.report import Anchored, ConformanceError, Failure, Judged, Report

__all__ = [
    "LAYOUTS",
    "Anchored",
    "Budget",
    "ConformanceError",
    "Failure",
    "Judged",
    "Report",
    "check",
    "draw_like",
    "gradcheck_fd",
    "unit_roundoff",
]

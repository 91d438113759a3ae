"""The gate runs in a process whose backend flags are frozen (PyTorch's own test utilities call
``torch.backends.disable_global_flags()`` on import): it turns TF32 off without the frozen
setters, and judges as usual."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import plait


@pytest.fixture
def frozen_flags() -> Iterator[None]:
    was_frozen = torch.backends.flags_frozen()
    torch.backends.disable_global_flags()
    try:
        yield
    finally:
        if not was_frozen:
            setattr(torch.backends, "__allow_nonbracketed_mutation_flag", True)


def test_the_gate_judges_with_frozen_backend_flags(frozen_flags: None) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh()).eval()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        compiled(torch.randn(2, 5))
        report = plait.conformance.check(
            model, compiled, (torch.randn(2, 5),), candidate_module=model
        )
    assert report.ok, str(report)
    assert torch.backends.flags_frozen()

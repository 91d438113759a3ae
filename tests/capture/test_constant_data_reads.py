"""A read of tensor data (``if t:``, ``.item()``, ``.tolist()``) whose tensor the graph
computes from no input (only from constant factories of static sizes, such as Hugging Face's
``position_ids = arange(n)`` checked for packed sequences) is that constant, not a data read:
the program compiles whole and matches eager on fresh inputs. A read of anything that depends
on an input, a parameter, a captured tensor or a random draw stays a data read."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.frontend import capture_program
from tests.capture.helpers import assert_same


def _reads_constants(x: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(x.shape[-1]).expand(2, -1)
    steps_of_one = ((positions[:, 1:] - positions[:, :-1]) == 1).sum()
    if steps_of_one == positions.numel() - 2:  # NOTE: a bool of a constant
        x = x * 2
    steps = int((positions[0] * 3).sum().item())
    return x + steps + len(torch.ones(3).tolist())


def test_reads_of_constants_are_folded_under_fullgraph() -> None:
    compiled = plait.compile(_reads_constants, backend="eager", fullgraph=True)
    for i in range(2):
        x = torch.randn(3, 5, generator=torch.Generator().manual_seed(i))
        assert_same(compiled(x), _reads_constants(x), f"call {i}")
    spec = compiled.specializations[0]
    assert spec.fallback_reason is None
    assert len(compiled.specializations) == 1


def test_a_new_size_is_a_new_specialization_with_its_own_constants() -> None:
    compiled = plait.compile(_reads_constants, backend="eager", fullgraph=True)
    for n in (5, 7):
        x = torch.randn(3, n)
        assert_same(compiled(x), _reads_constants(x), f"size {n}")
    assert len(compiled.specializations) == 2


_CAPTURED = torch.ones(3)

REFUSED = {
    "input": lambda x: x * 2 if (x > 0).sum() > 1 else x,
    "random": lambda x: x * 2 if (torch.rand(3) > 0.5).sum() > 1 else x,
    "captured_tensor": lambda x: x * 2 if (_CAPTURED > 0).sum() > 1 else x,
    "tensor_result": lambda x: x[torch.nonzero(torch.arange(3))[:, 0]],
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_reads_of_anything_else_stay_data_reads(name: str) -> None:
    prog = capture_program(REFUSED[name], (torch.randn(3),), fullgraph=False)
    assert prog.graph is None
    # NOTE: nonzero's result is a node of data-dependent size, which indexing cannot take
    says = "unbacked size" if name == "tensor_result" else "reads tensor data"
    assert says in str(prog.fallback_reason), prog.fallback_reason

"""A linear's weight that changes between calls (an optimizer writes it in place) runs oneDNN's
linear on the plain weight instead of being reordered again before every forward; a weight
that stays put keeps its one conversion."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import plait
import plait.contract
from plait.codegen.extern import PreparedWeight
from plait.codegen.mkl_rows import RowPacks
from tests.util import assert_bitwise


def _counted(convert_calls: list[int], plain: bool = True) -> PreparedWeight:
    def convert(w: torch.Tensor) -> torch.Tensor:
        convert_calls.append(1)
        return w * 2

    return PreparedWeight(convert, plain=(lambda w: w.contiguous()) if plain else None)


def test_a_weight_unchanged_between_calls_is_converted_once() -> None:
    calls: list[int] = []
    weight = _counted(calls)
    w = torch.randn(4, 3)
    for _ in range(3):
        assert_bitwise(weight(w), w * 2)
    assert len(calls) == 1 and not weight.varies


def test_a_weight_written_between_calls_runs_plain_from_then_on() -> None:
    calls: list[int] = []
    weight = _counted(calls)
    w = torch.randn(4, 3)
    weight(w)
    w.add_(1.0)  # NOTE: what an optimizer step does
    assert_bitwise(weight(w), w)
    w.mul_(0.5)
    assert_bitwise(weight(w), w)
    assert len(calls) == 1 and weight.varies and weight.value is None


def test_another_tensor_is_converted_not_taken_for_a_changing_weight() -> None:
    calls: list[int] = []
    weight = _counted(calls)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    weight(a)
    assert_bitwise(weight(b), b * 2)
    assert len(calls) == 2 and not weight.varies


def test_a_weight_without_a_plain_form_is_converted_again() -> None:
    calls: list[int] = []
    weight = _counted(calls, plain=False)
    w = torch.randn(4, 3)
    weight(w)
    w.add_(1.0)
    assert_bitwise(weight(w), w * 2)
    assert len(calls) == 2 and not weight.varies


class _GeluMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.up(x), approximate="tanh")
        return self.down(h) + x


TOL = plait.contract.load().tolerance("model", "float32")


def _compiled(library: str, freeze: bool) -> tuple[nn.Module, Any]:
    """The seeded MLP and its compilation with ``library``'s float32 linears."""
    torch.manual_seed(0)
    model = _GeluMLP().eval()
    stax = {"mkl_linear": library == "MKL packed", "timed_matmul": False}
    return model, plait.compile(model, options={"cache": False, "freeze": freeze, "stax": stax})


def _reorders(fn: object) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()  # type: ignore[operator]
    return sum(e.count for e in prof.key_averages() if "_reorder_linear_weight" in e.key)


@pytest.mark.parametrize("library", ["MKL packed", "oneDNN"])
def test_weights_written_between_calls_stop_being_converted_and_match_eager(library: str) -> None:
    # NOTE: weights stay graph inputs (not frozen), as a model updated between calls has them
    model, compiled = _compiled(library, freeze=False)
    gen = torch.Generator().manual_seed(7)
    reorders = []
    with torch.no_grad():
        for call in range(5):
            x = torch.randn(16, 32, generator=gen)
            got: list[torch.Tensor] = []
            reorders.append(_reorders(lambda x=x, got=got: got.append(compiled(x))))
            torch.testing.assert_close(
                got[0],
                model(x),
                rtol=TOL.rtol,
                atol=TOL.atol,
                msg=lambda m, call=call: f"call {call}: {m}",
            )
            for p in model.parameters():  # NOTE: what an update between calls does
                p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    program = compiled.specializations[-1].compiled.program
    details = [t.detail for t in program.evidence.nodes.values() if f"{library} linear" in t.detail]
    assert details, f"no {library} linear ran: the test does not test its conversion"
    assert all("once written between calls, used unconverted" in d for d in details), details
    # NOTE: the first call converts; the second sees the write and runs plain, as all after it
    assert reorders[0] > 0 and reorders[1:] == [0] * 4, reorders
    assert len(compiled.specializations) == 1


def test_a_weight_given_other_memory_is_converted_again() -> None:
    """``w.data = other`` keeps the tensor and may bump no version counter; its memory moves."""
    calls: list[int] = []
    weight = _counted(calls, plain=False)
    w = torch.randn(4, 3)
    weight(w)
    w.data = torch.randn(4, 3)
    assert_bitwise(weight(w), w * 2)
    assert len(calls) == 2


def test_mkl_row_packs_of_a_weight_given_other_memory_are_dropped() -> None:
    packs = RowPacks()
    w = torch.randn(8, 16)
    first = packs(w, 4)
    w.data = torch.randn(8, 16)
    assert packs(w, 4) is not first and packs.packs[4] is not first


@pytest.mark.parametrize("library", ["MKL packed", "oneDNN"])
@pytest.mark.parametrize("freeze", [False, True])
def test_weights_given_other_memory_between_calls_answer_as_eager(
    library: str, freeze: bool
) -> None:
    """``linear.weight.data = ...`` between calls: the next call reads the new values (the
    live weight's converted copy was kept by identity and version counter alone)."""
    model, compiled = _compiled(library, freeze)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for call in range(4):
            x = torch.randn(16, 32, generator=gen)
            torch.testing.assert_close(
                compiled(x),
                model(x),
                rtol=TOL.rtol,
                atol=TOL.atol,
                msg=lambda m, call=call: f"call {call}: {m}",
            )
            for p in model.parameters():
                p.data = p.data + torch.randn(p.shape, generator=gen)

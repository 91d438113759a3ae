"""The protocol by which a CUDA forward graph lends its saved buffers to the backward graph
(``plait.runtime.cuda_handoff``), on CPU tensors standing in for the graphs' buffers: each
backward reads what its own step saved, whatever the order of forwards and backwards, and the
common order (forward, backward, forward...) makes no copy. The graphs themselves:
``tests/gpu/test_cuda_saved_handoff.py``."""

from __future__ import annotations

import pytest
import torch

from plait.runtime.cuda_handoff import (
    Handoff,
    Lease,
    Lent,
    StaleLeaseError,
    claimed,
    lent_values,
)


class _Step:
    """A stand-in for the two graphs: a forward replay writes fresh values into the buffers,
    a backward replay reads them."""

    def __init__(self) -> None:
        self.gen = torch.Generator().manual_seed(0)
        self.buffers = [torch.empty(3), torch.empty(2, 2)]
        self.handoff = Handoff(self.buffers)

    def forward(self) -> tuple[Lease, list[torch.Tensor]]:
        self.handoff.vacate()
        made = [torch.randn(b.shape, generator=self.gen) for b in self.buffers]
        for b, m in zip(self.buffers, made):
            b.copy_(m)
        return self.handoff.lend(), made

    def backward(self, lease: Lease, keep: bool = False) -> list[torch.Tensor]:
        self.handoff.borrow(lease)
        read = [b.clone() for b in self.buffers]
        self.handoff.returned(lease, keep)
        return read


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_steps_in_order_copy_nothing() -> None:
    step = _Step()
    for _ in range(4):
        lease, made = step.forward()
        _same(step.backward(lease), made)
    assert step.handoff.stashes == 0


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_two_forwards_then_both_backwards(order: tuple[int, int]) -> None:
    """Gradient accumulation over two micro-batches before one backward, in either order."""
    step = _Step()
    calls = [step.forward(), step.forward()]
    for i in order:
        lease, made = calls[i]
        _same(step.backward(lease), made)
    assert step.handoff.stashes >= 1


def test_retained_graph_reads_its_values_after_another_forward() -> None:
    step = _Step()
    lease, made = step.forward()
    _same(step.backward(lease, keep=True), made)
    tenant, later = step.forward()  # NOTE: the retained step still needs its values: a copy
    _same(step.backward(lease), made)
    _same(step.backward(tenant), later)  # NOTE: the tenant kept its values too


def test_a_released_step_refuses_a_second_backward() -> None:
    step = _Step()
    lease, _ = step.forward()
    step.backward(lease)
    with pytest.raises(StaleLeaseError, match="retain_graph=True"):
        step.backward(lease)


def test_a_dropped_step_costs_no_copy() -> None:
    step = _Step()
    step.forward()  # NOTE: its lease dropped at once: nobody needs its values
    step.forward()
    assert step.handoff.stashes == 0


def test_claimed_values_are_private_and_release_the_lease() -> None:
    step = _Step()
    lease, made = step.forward()
    values = claimed([Lent(lease, 1), "other", Lent(lease, 0)])
    assert values[1] == "other"
    _same([values[2], values[0]], made)
    assert values[0].data_ptr() != step.buffers[1].data_ptr()
    step.forward()
    assert step.handoff.stashes == 0  # NOTE: claimed: the buffers are free to reuse


def test_lent_values_come_from_one_call() -> None:
    step = _Step()
    first, _ = step.forward()
    second, _ = step.forward()
    assert lent_values([Lent(first, 0), 1.0, Lent(first, 1)], [0, 1, 2]) is first
    assert lent_values([torch.ones(1)], [0]) is None
    with pytest.raises(StaleLeaseError, match="two different forward calls"):
        lent_values([Lent(first, 0), Lent(second, 1)], [0, 1])

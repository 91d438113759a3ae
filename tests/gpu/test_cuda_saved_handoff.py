"""A training step's saved values handed from the forward's CUDA graph to the backward's in
place (``plait.runtime.cuda_handoff``): the backward graph reads the forward graph's buffers,
and every backward reads what its own step saved, in order (no copies), with two forwards
before their backwards (gradient accumulation), out of order, and with a retained graph run
again after another step, the backward's graph captured into the forward graph's memory pool.
Judged against the same compiled program run kernel by kernel (``cuda_graphs=False``), which
copies nothing. Skipped without CUDA."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from tests.util import contract_tol

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TOL = contract_tol("matmul", torch.float32)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 256), nn.ReLU(),
        nn.Linear(256, 10),
    ).cuda().train()  # fmt: skip


def _pair() -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    """(model, graphed compiled, model copy, kernel-by-kernel compiled)."""
    a, b = _model(), _model()
    b.load_state_dict(a.state_dict())
    graphed = plait.compile(a, backend="stax")
    plain = plait.compile(b, backend="stax", options={"stax": {"cuda_graphs": False}})
    return a, graphed, b, plain


def _batches(n: int) -> list[torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(11)
    return [torch.randn(32, 64, device="cuda", generator=gen) for _ in range(n)]


def _grads_match(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
        p.grad = q.grad = None


def _both(
    run: Callable[[nn.Module, list[torch.Tensor]], None], steps: int = 4
) -> tuple[nn.Module, nn.Module]:
    a, graphed, b, plain = _pair()
    xs = _batches(steps)
    run(graphed, xs)
    run(plain, xs)
    _grads_match(a, b)
    return graphed, plain


def _handoff(compiled: nn.Module) -> object:
    (spec,) = compiled._plait.specializations
    program = spec.compiled.program
    assert program.forward.cuda_graph["used"] and program.backward.cuda_graph["used"]
    assert program.forward.cuda_graph["lends"]["values"] > 0
    assert program.backward.cuda_graph["borrows"] == program.forward.cuda_graph["lends"]
    assert program.backward.cuda_graph["pool"] == "the forward's"
    return program.backward._call.handoff


def test_steps_in_order_read_the_forward_graphs_buffers() -> None:
    def run(m: nn.Module, xs: list[torch.Tensor]) -> None:
        for x in xs:
            m(x).square().mean().backward()

    graphed, _ = _both(run)
    handoff = _handoff(graphed)
    assert handoff.stashes == 0  # type: ignore[attr-defined]


def test_two_forwards_before_one_backward() -> None:
    def run(m: nn.Module, xs: list[torch.Tensor]) -> None:
        (m(xs[0]).square().mean() + m(xs[1]).sum()).backward()

    graphed, _ = _both(run)
    assert _handoff(graphed).stashes >= 1  # type: ignore[attr-defined]


def test_backwards_out_of_order() -> None:
    def run(m: nn.Module, xs: list[torch.Tensor]) -> None:
        first, second = m(xs[0]).square().mean(), m(xs[1]).sum()
        second.backward()
        first.backward()

    _both(run)


def test_a_retained_graph_run_again_after_another_step() -> None:
    def run(m: nn.Module, xs: list[torch.Tensor]) -> None:
        kept = m(xs[0]).square().mean()
        kept.backward(retain_graph=True)
        m(xs[1]).sum().backward()
        kept.backward()

    _both(run)

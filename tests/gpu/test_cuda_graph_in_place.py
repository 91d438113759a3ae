"""Graphed programs read settled inputs where the caller keeps them
(``plait.runtime.cuda_graph_inputs``): after two calls at one address an input is read in
place, with the values it holds at each call (written in place between calls), and a moved
input is copied again: never a stale or wrong answer. A training step's backward reads the
parameters and the cotangent in place; its forward (which lends its saved values to the
backward's graph) copies, and says why. Judged against eager PyTorch and against the same
program run kernel by kernel (``cuda_graphs=False``). Skipped without CUDA."""

from __future__ import annotations

from typing import Any

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
        nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 10)
    ).cuda()  # fmt: skip


def _draw(seed: int, shape: tuple[int, ...] = (32, 64)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).cuda()


def _program(compiled: Any) -> Any:
    """The first specialization's program (a moved parameter may guard a second one)."""
    return compiled.specializations[0].compiled.program


def test_an_input_written_in_place_between_calls_is_read_anew() -> None:
    f = plait.compile(lambda x, w: torch.tanh(x @ w) * 2)
    x, w = _draw(1), _draw(2, (64, 64))
    for k in range(5):
        x.copy_(_draw(10 + k))  # NOTE: the same address, new values
        w.mul_(0.9)
        torch.testing.assert_close(f(x, w), torch.tanh(x @ w) * 2, **TOL)
    record = _program(f).cuda_graph
    assert record["in_place"]["pinned"] == 2, record
    assert record["in_place"]["calls"]["in_place"] >= 3, record
    moved = w.clone()  # NOTE: a pinned input elsewhere: copied, and right
    torch.testing.assert_close(f(x, moved), torch.tanh(x @ moved) * 2, **TOL)
    assert record["in_place"]["calls"]["copied"] >= 3, record


def _step(m: nn.Module, opt: Any, x: torch.Tensor, cotangent: torch.Tensor) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    out = m(x)
    out.backward(cotangent)  # NOTE: autograd hands the compiled backward this very tensor
    opt.step()
    return (out.detach() * cotangent).sum()


def test_training_steps_read_parameters_and_cotangent_in_place() -> None:
    # NOTE: the cotangent is one tensor written in place each step: where a loss's backward
    # allocates it, its address depends on the caching allocator's free blocks (what earlier
    # tests of the process left cached), and whether it settles is not this test's question
    a, b = _model().train(), _model().train()
    graphed = plait.compile(a, backend="stax")
    plain = plait.compile(b, backend="stax", options={"stax": {"cuda_graphs": False}})
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    cotangent = _draw(100, (32, 10))
    for k in range(6):
        x = _draw(k)
        cotangent.copy_(_draw(200 + k, (32, 10)))
        got = _step(graphed, opt_a, x, cotangent)
        torch.testing.assert_close(got, _step(plain, opt_b, x, cotangent), **TOL)
        if k == 3:  # NOTE: a parameter moved (a new tensor under the same module)
            for m in (a, b):
                m[0].weight.data = m[0].weight.data.clone()
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL, msg=lambda s, n=name: f"{n}: {s}")
    program = _program(graphed)
    backward, forward = program.backward.cuda_graph, program.forward.cuda_graph
    assert backward["in_place"]["pinned"] > 0 and backward["in_place"]["captures"] >= 1, backward
    assert backward["in_place"]["calls"]["in_place"] >= 2, backward
    assert "lends its saved values" in forward["in_place_reason"], forward

"""An extern's result that shares storage with one of its operands (``unsafe_split``'s chunks,
which ATen's schema does not mark as aliases; a ``torch_vjp`` gradient that is a view of its
cotangent, as ``t_copy``'s is) is copied by the runner, never left pointing into a buffer the
memory plan reuses (the arena) or writes (the caller's input): whatever its strides, contiguous
or a layout the plan keeps (CPU programs without channels_last, every training program, keep an
extern result's layout)."""

from __future__ import annotations

import json

import torch
from torch import nn

import plait
from plait.ir import GraphBuilder, TensorType
from plait.runtime import StaxOptions
from plait.runtime.training import compile_training
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


class _Chunks(nn.Module):
    """Four chunks of a kernel's result (in the arena), then more kernels (arena temporaries)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.sigmoid(x) * 3 + x
        a, b, c, d = h.unsafe_chunk(4, self.dim)
        u = torch.exp(b) + torch.cos(c) * d
        v = u.sum(1, keepdim=True) * u
        return a * v + torch.tanh(a), v


def _check_training(model: nn.Module, shape: tuple[int, ...]) -> None:
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    for seed in (0, 1):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = compiled(mine), model(theirs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.detach(), **TOL)
        sum(o.sum() for o in got).backward()
        sum(o.sum() for o in want).backward()
        torch.testing.assert_close(mine.grad, theirs.grad, **TOL)


def test_a_transposed_chunk_of_a_kernel_result_in_training() -> None:
    """Batch 1, chunks along dim 1: chunk 0 has strides (24, 1), dense for shape (1, 6); kept
    (not copied) since training programs keep extern layouts, it reads the freed arena."""
    _check_training(_Chunks(dim=1), (1, 24))


def test_a_contiguous_chunk_of_a_kernel_result() -> None:
    """Chunks along dim 0: chunk 0 is contiguous at offset 0, never copied (with or without
    channels_last), and reads the arena after later kernels reuse it."""
    model = _Chunks(dim=0)
    compiled = plait.compile(model, backend="stax", options={"cache": False})
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for g, w in zip(compiled(x), model(x)):
            torch.testing.assert_close(g, w, **TOL)


def test_a_program_never_writes_its_callers_input() -> None:
    """Chunk 0 of an input is the input's own storage: an in-place epilogue over it wrote the
    caller's tensor."""

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = x.unsafe_chunk(2, 0)
        return torch.exp(a) * 2 + 1, b * 3

    compiled = plait.compile(
        f, backend="stax", options={"cache": False, "stax": {"channels_last": False}}
    )
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    before = x.clone()
    compiled(x)
    assert torch.equal(x, before)


def test_a_gradient_that_views_its_cotangent_survives_the_next_call() -> None:
    """``t_copy``'s gradient is its cotangent transposed; the cotangent is a kernel's (arena).
    The backward's gradient of x, kept as that view, changes when the program runs again before
    autograd sums it (one program called twice on one input)."""
    n = 4
    b = GraphBuilder()
    x = b.input("x", TensorType((n, n), torch.float32))
    c = b.param("c", TensorType((n, n), torch.float32))
    wt = b.call("aten", [x], name="t_copy", overload="default",
                literals=json.dumps([{"t": 0}]), kwliterals=json.dumps({}))  # fmt: skip
    wt = wt[0] if isinstance(wt, tuple) else wt
    b.output(b.call("sin", b.call("mul", wt, c)))
    prog = compile_training(b.build(), wrt=["x", "c"], options=StaxOptions(channels_last=False))
    gen = torch.Generator().manual_seed(0)
    x0, c1, c2 = (torch.randn(n, n, generator=gen) for _ in range(3))
    mine, theirs = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    (prog([mine, c1])[0] + 2 * prog([mine, c2])[0]).sum().backward()
    (torch.sin(theirs.t() * c1) + 2 * torch.sin(theirs.t() * c2)).sum().backward()
    torch.testing.assert_close(mine.grad, theirs.grad, **TOL)

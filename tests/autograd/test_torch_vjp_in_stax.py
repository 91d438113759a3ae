"""A ``torch_vjp`` node (PyTorch's autograd of an op's reference) runs in Stax as an extern."""

from __future__ import annotations

import torch

from plait.ir import GraphBuilder, TensorType
from plait.ir.ops.vjp import VjpContext, torch_vjp_rule
from plait.runtime import compile_graph


def test_torch_vjp_is_an_extern_call_with_eagers_gradient() -> None:
    b = GraphBuilder()
    x = b.input("x", TensorType((3, 5), torch.float32))
    g = b.input("g", TensorType((3, 5), torch.float32))
    y = b.call("softmax", x, dim=1)
    (gx,) = torch_vjp_rule(VjpContext(b, y.producer, (g,), (True,)))
    b.output(gx)
    program = compile_graph(b.build())
    gen = torch.Generator().manual_seed(0)
    xs, gs = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    leaf = xs.clone().requires_grad_(True)
    torch.softmax(leaf, 1).backward(gs)
    (out,) = program(xs, gs)
    assert torch.equal(out, leaf.grad)  # NOTE: the same kernels: bitwise
    counts = program.records()["evidence"]["counts"]
    assert counts["extern"] == 1 and counts["fallback"] == 0

"""Derivative rules of view and data-movement ops against PyTorch autograd and finite
differences, and their index maps against eager."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from plait.autograd import build_joint
from plait.conformance.gradcheck import gradcheck_fd
from plait.ir import (
    Category,
    GraphBuilder,
    TensorType,
    TypeRuleError,
    Value,
    all_ops,
    get_op,
    interpret,
)
from plait.ir.ops.movement import pad_sources
from plait.ir.ops.vjp import is_differentiable
from plait.symbolic import symbol
from tests.autograd.vjp_check import OneOp, check_op, differentiable_samples
from tests.ir.opdb import Sample

OPS = sorted(
    n for n, o in all_ops().items() if o.category is Category.VIEW and is_differentiable(n)
)


@pytest.mark.parametrize("op", OPS)
def test_view_vjp(op: str) -> None:
    assert check_op(op) > 0


def test_detach_has_no_derivative() -> None:
    assert not is_differentiable("detach")


def _sums_across_dims(sample: Sample) -> bool:
    """A padding of several dims: an element of a padded corner gets cotangents from a block of
    outputs, summed dim by dim here and in one row-major pass by eager's kernel (last-bit
    differences; check_op holds them to the gradcheck tolerance)."""
    return sample.op == "pad" and len(sample.attrs["pad"]) > 2


@pytest.mark.parametrize("op", OPS)
def test_view_gradients_are_bitwise_eager(op: str) -> None:
    for sample in differentiable_samples(op):
        if _sums_across_dims(sample):
            continue
        one = OneOp(sample, "min-cut")
        leaves = [t.detach().clone().requires_grad_(True) for t in one.inputs()]
        outs = one(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        gen = torch.Generator().manual_seed(3)
        cots = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
        got = torch.autograd.grad(outs, leaves, cots)
        refs = [t.detach().clone().requires_grad_(True) for t in leaves]
        theirs = one.reference(*refs)
        theirs = theirs if isinstance(theirs, tuple) else (theirs,)
        want = torch.autograd.grad(theirs, refs, cots)
        for a, e in zip(got, want):
            assert torch.equal(a, e), f"{op} [{sample.desc}]"


# NOTE: shapes the op database does not reach: gaps between windows, windows along an inner dim,
# strided slices that end early, diagonals of tall planes and inner dims, clamped, cropped or
# wrapped 1-D paddings, 3-D mirrors
EXTRA: list[tuple[str, tuple[int, ...], dict[str, Any]]] = [
    ("unfold", (2, 11), {"dim": 1, "size": 2, "step": 4}),
    ("unfold", (5, 3, 2), {"dim": 0, "size": 3, "step": 1}),
    ("unfold", (6,), {"dim": 0, "size": 6, "step": 3}),
    ("slice", (10, 2), {"dim": 0, "start": 2, "step": 3}),
    ("slice", (3, 11), {"dim": 1, "start": -8, "end": -1, "step": 4}),
    ("diagonal", (6, 3), {"offset": -2}),
    ("diagonal", (2, 5, 3, 4), {"offset": 1, "dim1": 1, "dim2": 3}),
    ("pad", (2, 5), {"pad": (-1, -2), "mode": "replicate"}),
    ("pad", (2, 3), {"pad": (-3, 2), "mode": "replicate"}),
    ("pad", (2, 5), {"pad": (4, 3), "mode": "reflect"}),
    ("pad", (2, 5), {"pad": (3, -1), "mode": "circular"}),
    ("pad", (1, 3, 4, 5), {"pad": (2, 1, 3, 0, 1, 2), "mode": "reflect"}),
    ("expand", (3, 1, 2), {"shape": (4, 3, 5, 2)}),
    ("select", (4, 5), {"dim": 1, "index": -5}),
]


@pytest.mark.parametrize(("op", "shape", "attrs"), EXTRA, ids=lambda v: str(v))
def test_more_shapes(op: str, shape: tuple[int, ...], attrs: dict[str, Any]) -> None:
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    sample = Sample(op, [x], attrs, lambda: None, f"{shape} {attrs}")
    one = OneOp(sample, "save-all")
    leaf = x.clone().requires_grad_(True)
    out = one(leaf)
    cot = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    (got,) = torch.autograd.grad(out, leaf, cot)
    ref = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(one.reference(ref), ref, cot)
    if _sums_across_dims(sample):
        # NOTE: corner elements sum one dim at a time, eager's kernel in one pass: about an ulp
        # apart. Deliberately sharper than the contract's float64 row for sums (2e-14): only
        # the order of a few additions may differ here, so a few ulps of float64 at most.
        ulps = 4 * torch.finfo(torch.float64).eps
        torch.testing.assert_close(got, want, rtol=ulps, atol=ulps)
    else:
        assert torch.equal(got, want)
    gradcheck_fd(one, (x,)).raise_if_failed()


def _joint_grads(b: GraphBuilder, inputs: list[torch.Tensor], cots: list[torch.Tensor]) -> list:
    graph = b.build()
    joint = build_joint(graph, [v.name for v in graph.inputs])
    out = interpret(joint.graph, [*inputs, *cots])
    grads = out[len(graph.outputs) :]
    for v, g in zip(graph.inputs, grads):
        assert isinstance(g, torch.Tensor) and TensorType.of(g) == v.type
    return grads


@pytest.mark.parametrize("op", ["cat", "stack"])
def test_promoting_ops_give_each_operand_its_dtype(op: str) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, dtype=torch.float32, generator=gen)
    y = torch.randn(2, 3, dtype=torch.float64, generator=gen)
    b = GraphBuilder()
    xv = b.input("x", TensorType.of(x))
    yv = b.input("y", TensorType.of(y))
    out = b.call(op, [xv, yv], dim=1)
    b.output(out)
    assert isinstance(out.type, TensorType)
    cot = torch.randn(out.type.shape, dtype=torch.float64, generator=gen)
    grads = _joint_grads(b, [x, y], [cot])
    leaves = [x.clone().requires_grad_(True), y.clone().requires_grad_(True)]
    fn = torch.cat if op == "cat" else torch.stack
    want = torch.autograd.grad(fn(leaves, 1), leaves, cot)
    for g, w in zip(grads, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("op", ["split", "chunk"])
def test_pieces_nobody_reads_get_zeros(op: str) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(7, 4, dtype=torch.float64, generator=gen)
    b = GraphBuilder()
    xv = b.input("x", TensorType.of(x))
    attrs = {"sizes": (3, 3, 1)} if op == "split" else {"chunks": 3}
    pieces = b.call(op, xv, dim=0, **attrs)
    b.output(pieces[1])
    cot = torch.randn(3, 4, dtype=torch.float64, generator=gen)
    (grad,) = _joint_grads(b, [x], [cot])
    want = torch.zeros_like(x)
    want[3:6] = cot
    assert torch.equal(grad, want)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_sources_are_eager_index_maps(mode: str) -> None:
    checked = 0
    for n, before, after in itertools.product(range(1, 6), range(-5, 6), range(-5, 6)):
        x = torch.arange(n, dtype=torch.float64).view(1, 1, n)
        try:  # NOTE: the paddings the IR accepts (eager reads garbage for some others)
            get_op("pad").infer(
                [Value("x", TensorType.of(x))], {"pad": (before, after), "mode": mode}
            )
        except TypeRuleError:
            continue
        want = F.pad(x, (before, after), mode=mode).flatten().long().tolist()
        assert pad_sources(mode, n, before, after) == want, (n, before, after)
        checked += 1
    assert checked > 20


def _eager_views(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    c = torch.cat([x, y])
    first, second = c.split([x.shape[0], 3])
    stacked = torch.stack([x, x], 1)
    return [
        first[1:][-1],
        second,
        c[::2],
        stacked.diagonal(0, 1, 2),
        x.unfold(1, 2, 2),
        F.pad(x, (1, 1), mode="reflect"),
        F.pad(x.t(), (1, 2), mode="replicate"),
        first[1:][-1].unsqueeze(0).expand(x.shape[0], 4),
        x.roll(1, 0).flip(0),
        c.permute(1, 0).reshape(-1),
    ]


def _symbolic_views() -> GraphBuilder:
    s = symbol("s0")
    b = GraphBuilder()
    x = b.input("x", TensorType((s, 4), torch.float64))
    y = b.input("y", TensorType((3, 4), torch.float64))
    c = b.call("cat", [x, y], dim=0)
    first, second = b.call("split", c, sizes=(s, 3), dim=0)
    last = b.call("select", b.call("slice", first, dim=0, start=1), dim=0, index=-1)
    stacked = b.call("stack", [x, x], dim=1)
    b.output(
        last,
        second,
        b.call("slice", c, dim=0, step=2),
        b.call("diagonal", stacked, offset=0, dim1=1, dim2=2),
        b.call("unfold", x, dim=1, size=2, step=2),
        b.call("pad", x, pad=(1, 1), mode="reflect"),
        b.call("pad", b.call("transpose", x, dim0=0, dim1=1), pad=(1, 2), mode="replicate"),
        b.call("expand", b.call("unsqueeze", last, dim=0), shape=(s, 4)),
        b.call("flip", b.call("roll", x, shifts=(1,), dims=(0,)), dims=(0,)),
        b.call("reshape", b.call("permute", c, dims=(1, 0)), shape=(-1,)),
    )
    return b


@pytest.mark.parametrize("size", [2, 5])
def test_symbolic_shapes(size: int) -> None:
    """Rules over a symbolic dim keep their operands' types and compute eager's gradients (a
    strided slice or a mode padding of the symbolic dim goes through torch_vjp)."""
    graph = _symbolic_views().build()
    joint = build_joint(graph, ["x", "y"])
    assert joint.grads == [0, 1]
    grads = joint.graph.outputs[-2:]
    assert [v.type for v in grads if isinstance(v, Value)] == [v.type for v in graph.inputs]
    gen = torch.Generator().manual_seed(size)
    x = torch.randn(size, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randn(3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    outs = _eager_views(x, y)
    cots = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    want = torch.autograd.grad(outs, [x, y], cots)
    got = interpret(joint.graph, [x.detach(), y.detach(), *cots])
    for o, e in zip(got, outs):
        assert torch.equal(o, e.detach())
    for a, e in zip(got[len(outs) :], want):
        assert torch.equal(a, e)

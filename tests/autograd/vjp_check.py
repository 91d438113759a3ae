"""Check one op's derivative rule on the op database's samples.

For a float64 sample, the op becomes a one-node graph whose float tensor operands are inputs; its
joint graph (both partitioners) runs under :class:`CompiledAutograd` with the reference
interpreter. Its gradients must equal PyTorch autograd's on the op's reference implementation
for random cotangents, and the contract's finite-difference check
(:func:`plait.conformance.gradcheck.gradcheck_fd`) must pass on it.
"""

from __future__ import annotations

from typing import Any

import torch

import plait.contract
from plait.autograd import CompiledAutograd, build_joint, partition
from plait.conformance.gradcheck import gradcheck_fd
from plait.ir import GraphBuilder, TensorType, Value, get_op
from plait.ir.ops.vjp import is_differentiable
from tests.ir.opdb import Sample, samples

F64 = torch.float64


def _flat(args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(a if isinstance(a, list) else [a])
    return out


def differentiable_samples(op: str, seed: int = 0) -> list[Sample]:
    """The op's float64 samples with at least one float64 operand and no size-0 operand (a
    gradient of nothing checks nothing)."""
    if F64 not in get_op(op).dtypes:
        return []
    out = []
    for s in samples(op, F64, seed):
        tensors = [t for t in _flat(s.args) if isinstance(t, torch.Tensor)]
        if any(t.dtype == F64 for t in tensors) and all(t.numel() > 0 for t in tensors):
            out.append(s)
    return out


class OneOp:
    """``sample``'s op as a compiled-autograd callable over its float64 tensor operands."""

    def __init__(self, sample: Sample, partitioner: str) -> None:
        self.sample = sample
        opdef = get_op(sample.op)
        self.attrs = opdef.check_attrs(sample.attrs)
        b = GraphBuilder()
        self.positions: list[int] = []  # flat operand positions that are inputs
        self.constants: dict[int, Any] = {}
        operands: list[Any] = []
        flat = _flat(sample.args)
        for i, a in enumerate(flat):
            if isinstance(a, torch.Tensor):
                operands.append(b.input(f"a{i}", TensorType.of(a)))
                self.positions.append(i)
            else:
                operands.append(a)
        structured = opdef.structure(operands)
        outs = b.call(sample.op, *structured, **self.attrs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        b.output(*outs)
        graph = b.build()
        wrt = [v.name for v in graph.inputs if v.type.dtype == F64]  # type: ignore[union-attr]
        self.joint = build_joint(graph, wrt)
        self.partition = partition(self.joint, partitioner)
        self.run = CompiledAutograd.interpreted(
            self.partition,
            n_inputs=len(graph.inputs),
            n_outputs=len(graph.outputs),
            cotangents=self.joint.cotangents,
            grads=self.joint.grads,
            name=sample.op,
        )
        self.flat = flat

    def inputs(self) -> list[torch.Tensor]:
        return [self.flat[i] for i in self.positions]

    def __call__(self, *tensors: torch.Tensor) -> Any:
        out = self.run(list(tensors))
        return tuple(out) if len(out) > 1 else out[0]

    def reference(self, *tensors: torch.Tensor) -> Any:
        flat = list(self.flat)
        for i, t in zip(self.positions, tensors):
            flat[i] = t
        out = get_op(self.sample.op).run(flat, self.attrs)
        return tuple(out) if len(out) > 1 else out[0]


def _float_outs(out: Any) -> list[torch.Tensor]:
    outs = out if isinstance(out, tuple) else (out,)
    return [o for o in outs if isinstance(o, torch.Tensor) and o.dtype.is_floating_point]


def _fd_inputs(one: OneOp, gen: torch.Generator) -> tuple[torch.Tensor, ...] | None:
    """The sample's inputs for finite differences: float64 operands moved by a random offset of
    about 1e-3 (a thousand steps of the contract's eps), off the kinks the op database puts
    samples on for the forward tests (halves for round, bounds for hardshrink, zero for sign).
    None where the op is not finite there, its results are not float64, or they are beyond 1e4 in
    magnitude: the contract's finite-difference budget assumes O(1) results (its cancellation
    error grows as |f| / eps)."""
    moved = []
    for t in one.inputs():
        if t.dtype == F64:
            size = torch.rand(t.shape, generator=gen, dtype=F64) + 0.5
            sign = torch.randint(0, 2, t.shape, generator=gen, dtype=F64) * 2 - 1
            t = (t + 1e-3 * size * sign).contiguous()
        moved.append(t)
    outs = one.reference(*moved)
    outs = outs if isinstance(outs, tuple) else (outs,)
    floats = [o for o in outs if isinstance(o, torch.Tensor) and o.dtype.is_floating_point]
    if not floats or any(o.dtype != F64 or not bool(o.isfinite().all()) for o in floats):
        return None
    if any(o.numel() and float(o.abs().max()) > 1e4 for o in floats):
        return None
    return tuple(moved)


def _eager_grads(
    one: OneOp, leaves: list[torch.Tensor], cots: list[torch.Tensor]
) -> tuple[torch.Tensor | None, ...] | None:
    """PyTorch autograd's gradients of the reference; None where eager has no derivative
    ("not implemented": a number % tensor)."""
    refs = [t.detach().clone().requires_grad_(t.requires_grad) for t in leaves]
    theirs = _float_outs(one.reference(*refs))
    try:
        return torch.autograd.grad(
            theirs, [t for t in refs if t.requires_grad], cots, allow_unused=True
        )
    except RuntimeError as exc:
        if "not implemented" not in str(exc):
            raise
        return None


def check_op(op: str, seeds: tuple[int, ...] = (0,)) -> int:
    """Check ``op``'s rule on its samples: against PyTorch autograd on every sample (where eager
    has a derivative), and against finite differences wherever the op is finite and smooth
    around the (moved) sample, which must be at least one sample of the op and every sample
    eager cannot differentiate. Returns how many samples were checked."""
    assert is_differentiable(op), f"{op} has no derivative rule"
    tol = plait.contract.load().gradcheck
    checked = fd_checked = 0
    for seed in seeds:
        for sample in differentiable_samples(op, seed):
            for partitioner in ("save-all", "min-cut"):
                one = OneOp(sample, partitioner)
                where = f"{op} [{sample.desc}] {partitioner}"
                leaves = [t.detach().clone().requires_grad_(t.dtype == F64) for t in one.inputs()]
                ours = _float_outs(one(*leaves))
                gen = torch.Generator().manual_seed(seed + 1)
                cots = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in ours]
                wrt = [t for t in leaves if t.requires_grad]
                got = torch.autograd.grad(ours, wrt, cots, allow_unused=True)
                want = _eager_grads(one, leaves, cots)
                for k, (a, e) in enumerate(zip(got, want or ())):
                    a = torch.zeros_like(wrt[k]) if a is None else a
                    e = torch.zeros_like(wrt[k]) if e is None else e
                    what = f"{where}: gradient {k} differs from autograd"
                    torch.testing.assert_close(
                        a, e, rtol=tol.rtol, atol=tol.atol, equal_nan=True,
                        msg=lambda m, what=what: f"{what}: {m}",
                    )  # fmt: skip
                moved = _fd_inputs(one, gen)
                if moved is None:
                    assert want is not None, (
                        f"{where}: neither eager nor finite differences judge it"
                    )
                else:
                    gradcheck_fd(one, moved).raise_if_failed()
                    fd_checked += 1
                checked += 1
    assert fd_checked, f"{op}: no sample was judged by finite differences"
    return checked


def is_value(x: Any) -> bool:
    return isinstance(x, Value)

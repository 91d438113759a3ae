"""Release a compiled backward's gradients bucket by bucket, as eager autograd releases them.

A compiled training program runs its backward as one ``torch.autograd.Function``: every
parameter gradient appears when the whole backward has finished, so DDP's buckets all fire at
the end and no all-reduce overlaps the backward. :class:`ReleasedBackward` runs the backward's
segments (:func:`~plait.distributed.segments.split_backward`, one per bucket) as a chain of
autograd nodes; the forward program still runs once, whole. PyTorch's engine calls the first
node's backward, accumulates bucket 0's gradients (DDP's hooks fire and its all-reduce starts),
then calls the next node, which computes the next bucket while the first one is on the wire.

DDP rebuilds its buckets after the first iteration from the order gradients arrived, closing
each one as soon as its size reaches the cap. Gradients released by one node arrive in an
order of the engine's choosing, so a bucket's last gradient (the one whose bytes close it) has
a node of its own after the rest of its bucket (:func:`releases`): any other order could close
a bucket early, and DDP would then rebuild other buckets than the ones the backward is cut at.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.runtime.training import compile_training
    >>> from plait.distributed.buckets import bucket_plan
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((2, 4), torch.float32))
    >>> w1, w2 = (b.param(n, TensorType((4, 4), torch.float32)) for n in ("w1", "w2"))
    >>> b.output(b.call("matmul", b.call("relu", b.call("matmul", x, w1)), w2))
    >>> g = b.build()
    >>> training = compile_training(g, wrt=["w1", "w2"])
    >>> ws = {n: torch.randn(4, 4, requires_grad=True) for n in ("w1", "w2")}
    >>> plan = bucket_plan(g, ["w1", "w2"], ws, caps=(64, 64))
    >>> released = ReleasedBackward.of(training, plan)
    >>> [(r.segment, r.names) for r in released.releases]
    [(0, ['w2']), (1, ['w1'])]
    >>> released([torch.randn(2, 4), ws["w1"], ws["w2"]])[0].sum().backward()
    >>> ws["w1"].grad.shape
    torch.Size([4, 4])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.autograd.function import (
    CompiledAutograd,
    DoubleBackwardError,
    backward_inputs,
    keep_for_backward,
    without_autocast,
)
from plait.distributed.buckets import BucketPlan
from plait.distributed.segments import Segment, split_backward
from plait.errors import InternalCompilerError, InternalValueError
from plait.ir.graph import Value
from plait.runtime.cuda_handoff import claimed
from plait.runtime.program import compile_graphs


@dataclass
class Release:
    """One autograd node of the chain: the segment whose gradients it releases, whether it
    runs that segment first (``starts``), and the forward input names it releases."""

    segment: int
    starts: bool
    names: list[str]


def releases(segments: list[Segment]) -> list[Release]:
    """The chain's nodes in backward order: per segment, one node for all its gradients but
    the last and one for the last (see the module doc); the last segment (the last bucket,
    and the inputs DDP does not reduce) is one node."""
    out = []
    for k, s in enumerate(segments):
        if len(s.grads) > 1 and k < len(segments) - 1:
            out += [Release(k, True, s.grads[:-1]), Release(k, False, s.grads[-1:])]
        else:
            out.append(Release(k, True, list(s.grads)))
    return out


class ReleasedBackward(CompiledAutograd):
    """A training program's :class:`~plait.autograd.CompiledAutograd` (same forward, same
    calling convention) whose gradients are released bucket by bucket (see the module doc)."""

    def __init__(
        self,
        run: CompiledAutograd,
        inputs: Sequence[str],
        backward_inputs: Sequence[str],
        segments: list[Segment],
    ) -> None:
        super().__init__(
            run.forward,
            run.backward,
            n_inputs=run.n_inputs,
            n_outputs=run.n_outputs,
            cotangents=run.cotangents,
            grads=run.grads,
            name=run.name,
        )
        self.backward_inputs = list(backward_inputs)
        self.segments = segments
        self.releases = releases(segments)
        index = {n: i for i, n in enumerate(inputs)}
        # NOTE: per node, the positions (in the call's values) of the inputs it releases
        self.positions = [[index[n] for n in r.names] for r in self.releases]

    @classmethod
    def of(cls, training: Any, plan: BucketPlan, options: Any = None) -> ReleasedBackward:
        """Split ``training``'s (a :class:`~plait.runtime.training.TrainingProgram`) backward
        for ``plan`` and compile the segments (with the backward's own Stax options)."""
        run = training.run
        names = [training.graph.inputs[i].name for i in run.grads]
        segments = split_backward(training.backward_graph, names, plan)
        opts = options if options is not None else training.backward.options
        busy = [s for s in segments if s.graph.nodes]
        for s, p in zip(busy, compile_graphs([s.graph for s in busy], options=opts)):
            s.program = p
        inputs = [v.name for v in training.graph.inputs]
        return cls(run, inputs, [v.name for v in training.partition.backward.inputs], segments)

    def __call__(self, values: list[Any]) -> list[Any]:
        if len(values) != self.n_inputs:
            raise InternalValueError(f"{self.name} takes {self.n_inputs} inputs, got {len(values)}")
        call = _Call(self, values)
        token: Any = None
        for i in reversed(range(len(self.releases))):
            tensors = [values[p] for p in self.positions[i]]
            if i == 0:
                return list(_ReleaseOutputs.apply(call, token, *tensors))
            token = _ReleaseBucket.apply(call, i, token, *tensors)
        raise InternalCompilerError("a released backward has at least one node")

    def release(self, i: int, env: dict[str, Any]) -> list[Any]:
        """Node ``i``'s backward: its segment (if it starts one) on ``env`` (the backward's
        values by name), then the gradients it releases."""
        r = self.releases[i]
        s = self.segments[r.segment]
        if r.starts:
            if s.program is not None:
                consts = s.graph.constants
                args = [consts[v.name] if v.name in consts else env[v.name] for v in s.graph.inputs]
                env.update(zip(s.produces, without_autocast(s.program, *args)))
            for name in s.drop:
                env.pop(name, None)
        out = []
        for name in r.names:
            o = s.gradient(name)
            out.append(env[o.name] if isinstance(o, Value) else o)
            for dead in s.dies_with.get(name, ()):
                env.pop(dead, None)
        return out


class _Call:
    """One call's state: its values, the forward's results, the backward's values by name."""

    def __init__(self, released: ReleasedBackward, values: list[Any]) -> None:
        self.released = released
        self.values = values
        self.outs: list[Any] = []
        self.saved: list[Any] = []
        self.env: dict[str, Any] = {}

    def run_forward(self) -> None:
        run = self.released
        # NOTE: its own copies of saved values a CUDA forward graph lends (the segments read
        # them, not the backward graph they are lent to)
        results = claimed(without_autocast(run.forward, list(self.values)))
        self.outs, self.saved = results[: run.n_outputs], results[run.n_outputs :]


class _ReleaseBucket(torch.autograd.Function):
    """Node ``i > 0``. The first one applied (the last in the backward: no token) runs the
    forward; the backward releases node ``i``'s gradients."""

    @staticmethod
    def forward(ctx: Any, call: _Call, i: int, token: Any, *tensors: Any) -> Any:
        if token is None:
            call.run_forward()
        ctx.call, ctx.i, ctx.chained = call, i, token is not None
        return torch.empty(0)

    @staticmethod
    def backward(ctx: Any, _token: Any) -> Any:
        call: _Call = ctx.call
        grads = call.released.release(ctx.i, call.env)
        if not ctx.chained:
            call.env = {}  # NOTE: the backward's last node
        return (None, None, torch.empty(0) if ctx.chained else None, *grads)


class _ReleaseOutputs(torch.autograd.Function):
    """Node 0, applied last: returns the forward's outputs. Its backward takes their
    cotangents, sets up the backward's values and releases the first bucket."""

    @staticmethod
    def forward(ctx: Any, call: _Call, token: Any, *tensors: Any) -> Any:
        if token is None:  # NOTE: a chain of one node: the forward runs here
            call.run_forward()
        run = call.released
        outs, saved = call.outs, call.saved
        call.outs, call.saved = [], []
        ctx.call, ctx.chained = call, token is not None
        # NOTE: saved here, where the backward starts: an in-place write to one before the
        # backward raises PyTorch's error, as for a program that is not split
        keep_for_backward(ctx, outs, saved, run.cotangents)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *cotangents: Any) -> Any:
        call: _Call = ctx.call
        run = call.released
        if torch.is_grad_enabled():
            raise DoubleBackwardError(
                f"{run.name}: its backward is compiled and has no derivative of its own; "
                "a second-order gradient needs the call run eagerly (backend='eager')"
            )
        inputs = backward_inputs(ctx, cotangents, run.cotangents)
        call.env = dict(zip(run.backward_inputs, inputs))
        grads = run.release(0, call.env)
        if not ctx.chained:
            call.env = {}
        return (None, torch.empty(0) if ctx.chained else None, *grads)

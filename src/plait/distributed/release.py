"""Release a compiled backward's gradients bucket by bucket, as eager autograd releases them.

A compiled training program runs its backward as one ``torch.autograd.Function``: every
parameter gradient appears when the whole backward has finished, so DDP's buckets all fire at
the end and no all-reduce overlaps the backward. :func:`split_backward` cuts the compiled
backward graph into one segment per bucket (:mod:`plait.distributed.buckets`), in release
order: segment ``k`` computes what bucket ``k``'s gradients need that earlier segments did not,
and hands the values later segments read on to them. :class:`ReleasedBackward` runs the
segments as a chain of autograd nodes (the forward program still runs once, whole): PyTorch's
engine calls node ``k``'s backward, accumulates bucket ``k``'s gradients (DDP's hooks fire and
its all-reduce starts), then calls node ``k + 1``, which computes the next bucket while the
first one is on the wire.

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
    >>> [s.grads for s in released.segments]
    [['w2'], ['w1']]
    >>> released([torch.randn(2, 4), ws["w1"], ws["w2"]])[0].sum().backward()
    >>> ws["w1"].grad.shape
    torch.Size([4, 4])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.autograd.function import CompiledAutograd, DoubleBackwardError, without_autocast
from plait.distributed.buckets import BucketPlan
from plait.ir.graph import Graph, Node, Operand, Value
from plait.ir.verify import verify
from plait.runtime.program import StaxProgram, compile_graphs


@dataclass
class Segment:
    """One bucket's part of the backward: the graph it runs (inputs by name: backward inputs,
    or values an earlier segment computed), the forward inputs whose gradients it releases
    (by name), and what it hands on (``produces``: its graph's outputs, by name)."""

    graph: Graph
    grads: list[str]  # forward input names, in the order the node returns them
    grad_values: list[Operand]  # the backward values (or literals) that are those gradients
    produces: list[str]
    node_ids: list[int]
    program: StaxProgram | None = None
    drop: list[str] = field(default_factory=list)  # values no later segment reads


def _producers(g: Graph) -> dict[str, Node]:
    return {v.name: n for n in g.nodes for v in n.outputs}


def _ancestors(g: Graph, roots: Sequence[Value], made: dict[str, Node]) -> set[int]:
    seen: set[int] = set()
    work = list(roots)
    while work:
        node = made.get(work.pop().name)
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        work.extend(node.input_values())
    return seen


def split_backward(backward: Graph, grad_names: Sequence[str], plan: BucketPlan) -> list[Segment]:
    """``backward`` (outputs: the gradients of the forward inputs ``grad_names``, in order) cut
    into one segment per bucket of ``plan`` (the inputs of no bucket go with the last)."""
    names = [v.name for v in [*backward.inputs, *(o for n in backward.nodes for o in n.outputs)]]
    if len(set(names)) != len(names):
        raise ValueError("the backward graph names a value twice; it cannot be split by name")
    bucket_of = {n: k for k, b in enumerate(plan.buckets) for n in b.names}
    last = len(plan.buckets) - 1
    made = _producers(backward)
    order = {n.id: i for i, n in enumerate(backward.nodes)}
    assigned: set[int] = set()
    parts: list[tuple[list[str], list[Operand], list[int]]] = []
    for k in range(len(plan.buckets)):
        grads = [
            (n, o) for n, o in zip(grad_names, backward.outputs) if bucket_of.get(n, last) == k
        ]
        roots = [o for _, o in grads if isinstance(o, Value)]
        ids = sorted(_ancestors(backward, roots, made) - assigned, key=order.__getitem__)
        assigned.update(ids)
        parts.append(([n for n, _ in grads], [o for _, o in grads], ids))
    return _segments(backward, parts)


def _segments(
    backward: Graph, parts: list[tuple[list[str], list[Operand], list[int]]]
) -> list[Segment]:
    by_id = {n.id: n for n in backward.nodes}
    home = {v.name: k for k, (_, _, ids) in enumerate(parts) for i in ids for v in by_id[i].outputs}
    # NOTE: per value, the last segment that needs it from outside its own (or as a gradient)
    last_use: dict[str, int] = {}
    for k, (_, grad_values, ids) in enumerate(parts):
        for i in ids:
            for v in by_id[i].input_values():
                if home.get(v.name) != k:
                    last_use[v.name] = k
        for o in grad_values:
            if isinstance(o, Value):
                last_use[o.name] = k
    segments = []
    for k, (grads, grad_values, ids) in enumerate(parts):
        nodes = [by_id[i] for i in ids]
        produced = [v for n in nodes for v in n.outputs]
        handed = [v for v in produced if last_use.get(v.name, -1) >= k]
        graph = _subgraph(backward, nodes, handed)
        drop = [n for n, last in last_use.items() if last == k]
        segments.append(
            Segment(graph, grads, grad_values, [v.name for v in handed], ids, drop=drop)
        )
    return segments


def _subgraph(backward: Graph, nodes: list[Node], outputs: list[Value]) -> Graph:
    """A graph of ``nodes`` (copied) whose inputs are the values they read from outside."""
    mapping: dict[str, Value] = {}
    out = Graph()
    inside = {v.name for n in nodes for v in n.outputs}
    for n in nodes:
        for v in n.input_values():
            if v.name not in inside and v.name not in mapping:
                mapping[v.name] = Value(v.name, v.type, None, 0, v.kind or "user")
                out.inputs.append(mapping[v.name])
    for n in nodes:
        ins = tuple(mapping[o.name] if isinstance(o, Value) else o for o in n.inputs)
        node = Node(n.id, n.op, ins, dict(n.attrs))
        node.outputs = tuple(Value(v.name, v.type, node, v.index) for v in n.outputs)
        mapping.update((v.name, nv) for v, nv in zip(n.outputs, node.outputs))
        out.nodes.append(node)
    out.outputs = [mapping[v.name] for v in outputs]
    out.constants = {
        k: v for k, v in backward.constants.items() if k in {i.name for i in out.inputs}
    }
    verify(out)
    return out


class ReleasedBackward(CompiledAutograd):
    """A training program's :class:`~plait.autograd.CompiledAutograd` (same forward, same
    calling convention) whose gradients are released segment by segment (see the module
    doc)."""

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
        index = {n: i for i, n in enumerate(inputs)}
        # NOTE: per segment, the positions (in the call's values) of the inputs it releases
        self.positions = [[index[n] for n in s.grads] for s in segments]

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
            raise ValueError(f"{self.name} takes {self.n_inputs} inputs, got {len(values)}")
        call = _Call(self, values)
        token: Any = None
        for k in reversed(range(len(self.segments))):
            tensors = [values[i] for i in self.positions[k]]
            if k == 0:
                return list(_ReleaseOutputs.apply(call, token, *tensors))
            token = _ReleaseBucket.apply(call, k, token, *tensors)
        raise AssertionError("a released backward has at least one segment")

    def run_segment(self, k: int, env: dict[str, Any]) -> list[Any]:
        """Run segment ``k`` on ``env`` (values by name); returns its gradients."""
        s = self.segments[k]
        if s.graph.nodes:
            assert s.program is not None
            consts = s.graph.constants
            args = [consts[v.name] if v.name in consts else env[v.name] for v in s.graph.inputs]
            env.update(zip(s.produces, without_autocast(s.program, *args)))
        grads = [env[o.name] if isinstance(o, Value) else o for o in s.grad_values]
        for name in s.drop:
            env.pop(name, None)
        return grads


class _Call:
    """One call's state: its values, the forward's results, each backward's values by name."""

    def __init__(self, released: ReleasedBackward, values: list[Any]) -> None:
        self.released = released
        self.values = values
        self.outs: list[Any] = []
        self.saved: list[Any] = []
        self.env: dict[str, Any] = {}


class _ReleaseBucket(torch.autograd.Function):
    """Node ``k > 0``: the last one applied runs the forward (k = K-1, no token); its backward
    runs segment ``k``."""

    @staticmethod
    def forward(ctx: Any, call: _Call, k: int, token: Any, *tensors: Any) -> Any:
        if token is None:  # NOTE: the first node applied: the forward runs here, once
            run = call.released
            results = list(without_autocast(run.forward, list(call.values)))
            call.outs, call.saved = results[: run.n_outputs], results[run.n_outputs :]
        ctx.call, ctx.k, ctx.chained = call, k, token is not None
        return torch.empty(0)

    @staticmethod
    def backward(ctx: Any, _token: Any) -> Any:
        call: _Call = ctx.call
        grads = call.released.run_segment(ctx.k, call.env)
        passed = torch.empty(0) if ctx.chained else None
        return (None, None, passed, *grads)


class _ReleaseOutputs(torch.autograd.Function):
    """Node 0, applied last: returns the forward's outputs; its backward takes their
    cotangents, sets up the backward's values and runs segment 0 (the first bucket)."""

    @staticmethod
    def forward(ctx: Any, call: _Call, token: Any, *tensors: Any) -> Any:
        if token is None:  # NOTE: one bucket only: the forward runs here
            run = call.released
            results = list(without_autocast(run.forward, list(call.values)))
            call.outs, call.saved = results[: run.n_outputs], results[run.n_outputs :]
        run = call.released
        outs, saved = call.outs, call.saved
        call.outs, call.saved = [], []
        ctx.call, ctx.chained = call, token is not None
        ctx.outs = [
            (o.shape, o.dtype, o.device) if isinstance(o, torch.Tensor) else None for o in outs
        ]
        # NOTE: saved here, where the backward starts: an in-place write to one before the
        # backward raises PyTorch's error, as for a program that is not split
        ctx.save_for_backward(*(t for t in saved if isinstance(t, torch.Tensor)))
        ctx.others = [None if isinstance(t, torch.Tensor) else t for t in saved]
        taking = set(run.cotangents)
        dead = [o for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and i not in taking]
        ctx.mark_non_differentiable(*dead)
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
        cots = []
        for i in run.cotangents:
            c = cotangents[i]
            if c is None:
                shape, dtype, device = ctx.outs[i]
                c = torch.zeros(shape, dtype=dtype, device=device)
            cots.append(c.contiguous())
        tensors = iter(ctx.saved_tensors)
        saved = [next(tensors) if o is None else o for o in ctx.others]
        call.env = dict(zip(call.released.backward_inputs, [*saved, *cots]))
        grads = call.released.run_segment(0, call.env)
        passed = torch.empty(0) if ctx.chained else None
        return (None, passed, *grads)

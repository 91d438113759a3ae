"""Cut a compiled backward graph into one segment per gradient bucket.

:func:`split_backward` walks the buckets in release order (:mod:`plait.distributed.buckets`):
segment ``k`` holds the nodes bucket ``k``'s gradients need that no earlier segment computed,
in the backward's own order; a value a later segment reads is one of its outputs (handed on by
name), a value nothing later reads is dropped once it was used. Every node lands in at most one
segment, so the segments do the backward's work once, and each node keeps its operands and
attributes: the split changes when a gradient is released, never what it is.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.distributed.buckets import Bucket, BucketPlan
    >>> b = GraphBuilder()
    >>> g1 = b.input("g1", TensorType((4,), torch.float32))
    >>> g2 = b.input("g2", TensorType((4,), torch.float32))
    >>> b.output(b.call("mul", g1, 2.0), b.call("exp", g2))
    >>> plan = BucketPlan([Bucket(["w2"], 16), Bucket(["w1"], 16)], caps=(16, 16))
    >>> [s.grads for s in split_backward(b.build(), ["w1", "w2"], plan)]
    [['w2'], ['w1']]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.distributed.buckets import BucketPlan
from plait.errors import InternalValueError
from plait.ir.graph import Graph, Node, Operand, Value
from plait.ir.verify import verify


@dataclass
class Segment:
    """One bucket's part of the backward: the graph it runs (inputs by name: the backward's
    inputs, or values an earlier segment computed), the forward inputs whose gradients it
    releases (by name, in the bucket's order, then the inputs of no bucket for the last one),
    what it hands on (``produces``: its graph's outputs), what dies after it (``drop``) and
    what dies with each gradient it releases (``dies_with``: then the engine takes the tensor
    as the gradient instead of copying it)."""

    graph: Graph
    grads: list[str]
    grad_values: list[Operand]  # the backward values (or literals) that are those gradients
    produces: list[str]
    node_ids: list[int]
    program: Any = None  # its compiled program (a StaxProgram), once compiled
    drop: list[str] = field(default_factory=list)
    dies_with: dict[str, list[str]] = field(default_factory=dict)

    def gradient(self, name: str) -> Operand:
        return self.grad_values[self.grads.index(name)]


def _producers(g: Graph) -> dict[str, Node]:
    return {v.name: n for n in g.nodes for v in n.outputs}


def _ancestors(roots: Sequence[Value], made: dict[str, Node]) -> set[int]:
    seen: set[int] = set()
    work = list(roots)
    while work:
        node = made.get(work.pop().name)
        if node is None or node.id in seen:
            continue
        seen.add(node.id)
        work.extend(node.input_values())
    return seen


Part = tuple[list[str], list[Operand], list[int]]


def split_backward(backward: Graph, grad_names: Sequence[str], plan: BucketPlan) -> list[Segment]:
    """``backward`` (its outputs: the gradients of the forward inputs ``grad_names``, in that
    order) cut into one segment per bucket of ``plan``; the inputs of no bucket go with the
    last. Raises ``ValueError`` for a graph that names a value twice."""
    names = [v.name for v in [*backward.inputs, *(o for n in backward.nodes for o in n.outputs)]]
    if len(set(names)) != len(names):
        raise InternalValueError(
            "the backward graph names a value twice; it cannot be split by name"
        )
    in_buckets = {n for b in plan.buckets for n in b.names}
    output_of = dict(zip(grad_names, backward.outputs))
    made = _producers(backward)
    order = {n.id: i for i, n in enumerate(backward.nodes)}
    assigned: set[int] = set()
    parts: list[Part] = []
    for k, bucket in enumerate(plan.buckets):
        grads = list(bucket.names)
        if k == len(plan.buckets) - 1:
            grads += [n for n in grad_names if n not in in_buckets]
        values = [output_of[n] for n in grads]
        roots = [o for o in values if isinstance(o, Value)]
        ids = sorted(_ancestors(roots, made) - assigned, key=order.__getitem__)
        assigned.update(ids)
        parts.append((grads, values, ids))
    return _segments(backward, parts)


def _last_uses(by_id: dict[int, Node], parts: list[Part]) -> dict[str, int]:
    """Per value, the last segment that needs it from outside its own, or as a gradient."""
    home = {v.name: k for k, (_, _, ids) in enumerate(parts) for i in ids for v in by_id[i].outputs}
    last: dict[str, int] = {}
    for k, (_, values, ids) in enumerate(parts):
        for i in ids:
            for v in by_id[i].input_values():
                if home.get(v.name) != k:
                    last[v.name] = k
        for o in values:
            if isinstance(o, Value):
                last[o.name] = k
    return last


def _segments(backward: Graph, parts: list[Part]) -> list[Segment]:
    by_id = {n.id: n for n in backward.nodes}
    last = _last_uses(by_id, parts)
    segments = []
    for k, (grads, values, ids) in enumerate(parts):
        nodes = [by_id[i] for i in ids]
        handed = [v for n in nodes for v in n.outputs if last.get(v.name, -1) >= k]
        released = {o.name for o in values if isinstance(o, Value)}
        dies_with: dict[str, list[str]] = {}
        for name, o in zip(grads, values):  # NOTE: a value dies with the last gradient it is
            if isinstance(o, Value) and last[o.name] == k:
                for others in dies_with.values():
                    if o.name in others:
                        others.remove(o.name)
                dies_with.setdefault(name, []).append(o.name)
        segments.append(
            Segment(
                _subgraph(backward, nodes, handed),
                grads,
                values,
                [v.name for v in handed],
                ids,
                drop=[n for n, at in last.items() if at == k and n not in released],
                dies_with=dies_with,
            )
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
    names = {i.name for i in out.inputs}
    out.constants = {k: v for k, v in backward.constants.items() if k in names}
    verify(out)
    return out

"""Canonical form and semantic hash of a graph; the separate hash of its weights.

The canonical text names user inputs by position, keeps parameter/buffer/constant inputs by their
state_dict path (that path binds the weight, so it is part of the program), prints every
attribute (defaults included, keys sorted), and orders nodes canonically: among the nodes ready at
each step, the one with the smallest structural key goes first. Random nodes keep their relative
order (they draw from one RNG stream), so reordering them changes the hash.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, semantic_hash
    >>> def build(names):
    ...     b = GraphBuilder()
    ...     x = b.input(names[0], TensorType((4,), torch.float32))
    ...     b.output(b.call("exp", x, names=[names[1]]))
    ...     return b.build()
    >>> semantic_hash(build(["x", "y"])) == semantic_hash(build(["a", "b"]))
    True
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping

import torch

from plait.ir.graph import Graph, Node, Value
from plait.ir.text import format_type, format_value


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _input_label(v: Value, position: int) -> str:
    return f"{v.kind}:{position}" if v.kind == "user" else f"{v.kind}:{v.name}"


def _sorted_attrs(node: Node) -> str:
    return "{" + ", ".join(f"{k}={format_value(node.attrs[k])}" for k in sorted(node.attrs)) + "}"


def canonical_order(graph: Graph) -> list[Node]:
    """Nodes in a topological order that does not depend on the order they were given in."""
    from plait.ir.ops import get_op

    keys: dict[int, str] = {id(v): _input_label(v, i) for i, v in enumerate(graph.inputs)}
    random_nodes = [n for n in graph.nodes if get_op(n.op).is_random(n.attrs)]
    random_rank = {id(n): i for i, n in enumerate(random_nodes)}
    node_key: dict[int, str] = {}
    for node in graph.nodes:
        parts = [node.op, _sorted_attrs(node), ",".join(format_type(v.type) for v in node.outputs)]
        parts += [keys[id(o)] if isinstance(o, Value) else "lit:" + format_value(o)
                  for o in node.inputs]
        if id(node) in random_rank:
            parts.append(f"random#{random_rank[id(node)]}")
        node_key[id(node)] = _sha("\x1f".join(parts))
        for v in node.outputs:
            keys[id(v)] = f"{node_key[id(node)]}:{v.index}"

    # Kahn's algorithm; ties on equal keys (identical computations) break on canonical names.
    pending = {id(n): len({id(v.producer) for v in n.input_values() if v.producer is not None})
               for n in graph.nodes}
    consumers: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for producer_id in {id(v.producer) for v in n.input_values() if v.producer is not None}:
            consumers.setdefault(producer_id, []).append(n)
    names: dict[int, str] = {id(v): f"i{i}" for i, v in enumerate(graph.inputs)}
    heap: list[tuple[str, tuple[str, ...], int]] = []
    by_id = {id(n): n for n in graph.nodes}
    next_random = 0

    def ready(n: Node) -> bool:
        return pending[id(n)] == 0 and random_rank.get(id(n), next_random) == next_random

    def push(n: Node) -> None:
        operands = tuple(names[id(o)] for o in n.input_values())
        heapq.heappush(heap, (node_key[id(n)], operands, id(n)))

    for n in graph.nodes:
        if ready(n):
            push(n)
    order: list[Node] = []
    while heap:
        _, _, nid = heapq.heappop(heap)
        node = by_id[nid]
        order.append(node)
        for v in node.outputs:
            names[id(v)] = f"v{len(names) - len(graph.inputs)}"
        newly: list[Node] = []
        for c in consumers.get(nid, []):
            pending[id(c)] -= 1
            newly.append(c)
        if id(node) in random_rank:
            next_random += 1
            if next_random < len(random_nodes):
                newly.append(random_nodes[next_random])
        for c in dict.fromkeys(newly):
            if ready(c):
                push(c)
    if len(order) != len(graph.nodes):
        raise ValueError("graph has a cycle or a use before definition; run plait.ir.verify")
    return order


def canonical_text(graph: Graph) -> str:
    """The text the semantic hash is taken over (not meant to be parsed back)."""
    order = canonical_order(graph)
    names: dict[int, str] = {id(v): f"i{i}" for i, v in enumerate(graph.inputs)}
    lines = [f"input {_input_label(v, i)} {format_type(v.type)}"
             for i, v in enumerate(graph.inputs)]
    for node in order:
        for v in node.outputs:
            names[id(v)] = f"v{len(names) - len(graph.inputs)}"
        outs = ", ".join(names[id(v)] for v in node.outputs)
        args = ", ".join(names[id(o)] if isinstance(o, Value) else format_value(o)
                         for o in node.inputs)
        types = ", ".join(format_type(v.type) for v in node.outputs)
        lines.append(f"{outs} = {node.op}({args}) {_sorted_attrs(node)} : {types}")
    lines.append("return " + ", ".join(names[id(o)] if isinstance(o, Value) else format_value(o)
                                       for o in graph.outputs))
    return "\n".join(lines)


def semantic_hash(graph: Graph) -> str:
    """SHA-256 (hex) of the canonical text. Capture mints it once; later stages carry it."""
    return _sha(canonical_text(graph))


def weights_hash(weights: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over names, dtypes, shapes and bytes of the graph's constant tensors."""
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        h.update(f"{name}\x1f{t.dtype}\x1f{tuple(t.shape)}\x1e".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()

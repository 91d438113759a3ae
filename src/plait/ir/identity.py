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
from typing import Any

import torch
import xxhash

from plait.ir.chunked_hash import stream_digest
from plait.ir.graph import Graph, Node, Value
from plait.ir.literals import format_value
from plait.ir.ops.registry import get_op
from plait.ir.text import format_type
from plait.ir.verify import VerificationError


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _input_label(v: Value, position: int) -> str:
    return f"{v.kind}:{position}" if v.kind == "user" else f"{v.kind}:{v.name}"


def _sorted_attrs(node: Node) -> str:
    return "{" + ", ".join(f"{k}={format_value(node.attrs[k])}" for k in sorted(node.attrs)) + "}"


def _structural_keys(graph: Graph) -> dict[int, str]:
    """Merkle keys: a value's key covers its op, attributes, types and operands' keys.

    NOTE: equal keys mean identical computations; random nodes carry their position among
    random nodes, so two draws never share a key.
    """
    keys: dict[int, str] = {id(v): _input_label(v, i) for i, v in enumerate(graph.inputs)}
    random_rank = 0
    for node in graph.nodes:
        parts = [node.op, _sorted_attrs(node), ",".join(format_type(v.type) for v in node.outputs)]
        parts += [
            keys[id(o)] if isinstance(o, Value) else "lit:" + format_value(o) for o in node.inputs
        ]
        if get_op(node.op).is_random(node.attrs):
            parts.append(f"random#{random_rank}")
            random_rank += 1
        key = _sha("\x1f".join(parts))
        keys[id(node)] = key
        for v in node.outputs:
            keys[id(v)] = f"{key}:{v.index}"
    return keys


class _Namer:
    """Canonical names. NOTE: values with equal structural keys share one name, so which of two
    identical computations a user reads cannot change the canonical text."""

    def __init__(self, graph: Graph, keys: dict[int, str]) -> None:
        self.keys = keys
        self.by_key: dict[str, str] = {keys[id(v)]: f"i{i}" for i, v in enumerate(graph.inputs)}
        self.count = 0

    def define(self, node: Node) -> None:
        for v in node.outputs:
            if self.keys[id(v)] not in self.by_key:
                self.by_key[self.keys[id(v)]] = f"v{self.count}"
                self.count += 1

    def __call__(self, o: object) -> str:
        return self.by_key[self.keys[id(o)]] if isinstance(o, Value) else format_value(o)


def canonical_order(graph: Graph) -> list[Node]:
    """Nodes in a topological order that does not depend on the order they were given in."""
    return _canonical(graph)[0]


def _canonical(graph: Graph) -> tuple[list[Node], _Namer]:
    keys = _structural_keys(graph)
    random_nodes = [n for n in graph.nodes if get_op(n.op).is_random(n.attrs)]
    random_rank = {id(n): i for i, n in enumerate(random_nodes)}
    producers = {
        id(n): {id(v.producer) for v in n.input_values() if v.producer is not None}
        for n in graph.nodes
    }
    pending = {nid: len(ps) for nid, ps in producers.items()}
    consumers: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for pid in producers[id(n)]:
            consumers.setdefault(pid, []).append(n)
    namer = _Namer(graph, keys)
    heap: list[tuple[str, tuple[str, ...], int]] = []
    by_id = {id(n): n for n in graph.nodes}
    next_random = 0

    def push_if_ready(n: Node) -> None:
        if pending[id(n)] == 0 and random_rank.get(id(n), next_random) == next_random:
            operands = tuple(namer(o) for o in n.input_values())
            heapq.heappush(heap, (keys[id(n)], operands, id(n)))

    for n in graph.nodes:
        push_if_ready(n)
    order: list[Node] = []
    while heap:
        # NOTE: every ready node with the smallest key leaves together: equal keys are identical
        # computations sharing one canonical name, so none of them may get ahead of the others
        # (which one the heap yields first depends on memory addresses).
        key = heap[0][0]
        group = []
        while heap and heap[0][0] == key:
            group.append(by_id[heapq.heappop(heap)[2]])
        newly: list[Node] = []
        for node in group:
            order.append(node)
            namer.define(node)
            for c in consumers.get(id(node), []):
                pending[id(c)] -= 1
                newly.append(c)
            if id(node) in random_rank:
                next_random += 1
                if next_random < len(random_nodes):
                    newly.append(random_nodes[next_random])
        for c in {id(c): c for c in newly}.values():
            push_if_ready(c)
    if len(order) != len(graph.nodes):
        raise VerificationError("ssa", "a cycle or a use before definition")
    return order, namer


def canonical_text(graph: Graph) -> str:
    """The text the semantic hash is taken over (not meant to be parsed back)."""
    order, name = _canonical(graph)
    lines = [
        f"input {_input_label(v, i)} {format_type(v.type)}" for i, v in enumerate(graph.inputs)
    ]
    for node in order:
        outs = ", ".join(name(v) for v in node.outputs)
        args = ", ".join(name(o) for o in node.inputs)
        types = ", ".join(format_type(v.type) for v in node.outputs)
        lines.append(f"{outs} = {node.op}({args}) {_sorted_attrs(node)} : {types}")
    lines.append("return " + ", ".join(name(o) for o in graph.outputs))
    return "\n".join(lines)


def semantic_hash(graph: Graph) -> str:
    """SHA-256 (hex) of the canonical text. Capture mints it once; later stages carry it."""
    return _sha(canonical_text(graph))


WEIGHTS_HASH = "xxh3-128t"


def tensor_buffer(t: torch.Tensor) -> Any:
    """The bytes a tensor's digest is taken over: its values, dense, in row-major order, as
    stored (a view of the tensor's memory where it is a contiguous CPU tensor, else a copy)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().data if t.numel() else b""


def tensor_header(name: str, t: torch.Tensor) -> bytes:
    return f"{name}\x1f{t.dtype}\x1f{tuple(t.shape)}\x1e".encode()


def weights_hash(
    weights: Mapping[str, torch.Tensor], digests: Mapping[str, bytes] | None = None
) -> str:
    """``"xxh3-128t:<hex>"``: XXH3-128 over, for each of the graph's constant tensors in name
    order, its name, dtype and shape and the chunked XXH3-128 of its bytes
    (:func:`~plait.ir.chunked_hash.stream_digest` of :func:`tensor_buffer`). ``digests``: those
    per-tensor digests where the caller has them already (computed in the background, or
    remembered); the others are computed here. Content-addressed: the same values under the
    same names give the same text in every process and on every machine. The algorithm's name
    leads the text, so a digest taken another way (earlier plait: one stream over every tensor,
    BLAKE3, SHA-256) never equals it.

    NOTE: the digest tells weights apart for a cache key (a changed weight must miss); it is not
    a defence against someone crafting colliding weights (who can write the cache can write any
    entry). XXH3 runs at memory speed, in chunks on several threads: ResNet-18's 45 MB in about
    2 ms, against 5-11 ms for BLAKE3 and 26 ms for SHA-256 on the 2-core development machine,
    on every warm start.
    """
    digests = digests or {}
    top = xxhash.xxh3_128()
    for name in sorted(weights):
        t = weights[name]
        found = digests.get(name)
        top.update(tensor_header(name, t))
        top.update(found if found is not None else stream_digest([tensor_buffer(t)]))
    return f"{WEIGHTS_HASH}:{top.hexdigest()}"

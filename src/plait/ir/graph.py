"""The SSA graph as plain data: named inputs, nodes (:mod:`plait.ir.ssa`) in topological order,
outputs. Graphs are built node by node, with their types inferred, by
:class:`plait.ir.builder.GraphBuilder`, and parsed by :func:`plait.ir.parser.from_text`; a graph
prints as its IR text (:func:`plait.ir.text.to_text`).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((4, 8), torch.float32))
    >>> y = b.call("relu", b.call("add", x, 1.0))
    >>> b.output(y)
    >>> g = b.build()
    >>> [n.op for n in g.nodes]
    ['add', 'relu']
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plait.ir.errors import IRKeyError
from plait.ir.ssa import INPUT_KINDS, AttrValue, LiteralValue, Node, Operand, Value
from plait.ir.text import to_text

__all__ = [
    "INPUT_KINDS",
    "AttrValue",
    "Graph",
    "LiteralValue",
    "Node",
    "Operand",
    "Value",
    "value_map",
]


@dataclass(eq=False, repr=False)
class Graph:
    """``constants`` holds the values of ``const`` inputs the compiler owns (folded or frozen
    tensors); like weights, they are not part of the text or the semantic hash."""

    inputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Operand] = field(default_factory=list)
    constants: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> Graph:
        """A structural copy: new values and nodes with the same names and ids."""
        mapping: dict[int, Value] = {}

        def clone(v: Value, producer: Node | None) -> Value:
            new = Value(v.name, v.type, producer, v.index, v.kind)
            mapping[id(v)] = new
            return new

        def remap(o: Operand) -> Operand:
            return mapping[id(o)] if isinstance(o, Value) else o

        out = Graph(constants=dict(self.constants))
        out.inputs = [clone(v, None) for v in self.inputs]
        for n in self.nodes:
            node = Node(n.id, n.op, tuple(remap(o) for o in n.inputs), dict(n.attrs))
            node.outputs = tuple(clone(v, node) for v in n.outputs)
            out.nodes.append(node)
        out.outputs = [remap(o) for o in self.outputs]
        return out

    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise IRKeyError(f"graph has no input named {name!r}")

    def users(self) -> dict[Value, list[Node]]:
        """Map each value to the nodes that read it (in node order)."""
        out: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for v in node.input_values():
                out.setdefault(v, []).append(node)
        return out

    def next_node_id(self) -> int:
        return max((n.id for n in self.nodes), default=-1) + 1

    def __str__(self) -> str:
        return to_text(self)

    __repr__ = __str__


def value_map(graph: Graph) -> Mapping[str, Value]:
    """Every value of ``graph`` (inputs and node outputs) by name."""
    out = {v.name: v for v in graph.inputs}
    for n in graph.nodes:
        for v in n.outputs:
            out[v.name] = v
    return out

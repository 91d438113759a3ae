"""Building graphs by hand, node by node: each node's output types come from its op's type rule
(through the op registry), and the finished graph is verified.

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

from collections.abc import Sequence
from typing import Any

from plait.ir.errors import IRValueError
from plait.ir.graph import INPUT_KINDS, AttrValue, Graph, Node, Operand, Value, value_map
from plait.ir.ops.registry import get_op
from plait.ir.types import Type
from plait.ir.verify import verify as run_verify


class GraphBuilder:
    """Builds graphs by hand; output types come from each op's type rule."""

    def __init__(self) -> None:
        self.graph = Graph()
        self._names: set[str] = set()
        self._counter = 0
        # NOTE: the next node id, valid while the graph's node list is what this builder left
        # (its length and last node); any other change recomputes it (a linear scan)
        self._next_id = 0
        self._left: tuple[int, Node | None] = (0, None)

    @classmethod
    def extend(cls, graph: Graph) -> GraphBuilder:
        """A builder appending to ``graph`` in place (its names stay taken)."""
        b = cls()
        b.graph = graph
        b._names = set(value_map(graph))
        return b

    def _fresh(self, name: str | None) -> str:
        if name is None:
            while str(self._counter) in self._names:
                self._counter += 1
            name = str(self._counter)
            self._counter += 1
        if name in self._names:
            raise IRValueError(f"value name %{name} is already defined")
        self._names.add(name)
        return name

    def input(self, name: str, type: Type, kind: str = "user") -> Value:
        if kind not in INPUT_KINDS:
            raise IRValueError(f"input kind must be one of {INPUT_KINDS}, got {kind!r}")
        v = Value(self._fresh(name), type, kind=kind)
        self.graph.inputs.append(v)
        return v

    def param(self, name: str, type: Type) -> Value:
        return self.input(name, type, "param")

    def buffer(self, name: str, type: Type) -> Value:
        return self.input(name, type, "buffer")

    def call(
        self,
        op: str,
        *inputs: Operand | Sequence[Value],
        names: Sequence[str] | None = None,
        **attrs: AttrValue,
    ) -> Any:
        """Append ``op(*inputs, **attrs)``; returns its value, or a tuple for several outputs.

        A variadic parameter (``cat``, ``stack``) takes a list of values.
        """
        opdef = get_op(op)
        flat, full_attrs, out_types = opdef.infer(inputs, attrs)
        node = Node(self._node_id(), opdef.name, flat, full_attrs)
        if names is not None and len(names) != len(out_types):
            raise IRValueError(f"{op} has {len(out_types)} outputs, got {len(names)} names")
        node.outputs = tuple(
            Value(self._fresh(names[i] if names else None), t, node, i)
            for i, t in enumerate(out_types)
        )
        self.graph.nodes.append(node)
        self._next_id, self._left = node.id + 1, (len(self.graph.nodes), node)
        if opdef.fixed_outputs == 1:
            return node.outputs[0]
        return node.outputs

    def _node_id(self) -> int:
        nodes = self.graph.nodes
        count, last = self._left
        if count != len(nodes) or (nodes[-1] if nodes else None) is not last:
            self._next_id = self.graph.next_node_id()
        return self._next_id

    def output(self, *values: Operand) -> None:
        self.graph.outputs.extend(values)

    def build(self, verify: bool = True) -> Graph:
        """The graph built, checked by :func:`plait.ir.verify.verify` unless ``verify=False``."""
        if verify:
            run_verify(self.graph)
        return self.graph

"""The SSA graph: named inputs, nodes in topological order, outputs.

Operands of a node are :class:`Value` references or literals (``int``, ``float``, ``bool``,
``None``, or a sympy expression for a symbolic ``int``). Each node has one or more output values.

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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import sympy

from plait.ir.types import Type

INPUT_KINDS = ("user", "param", "buffer", "const")


@dataclass(eq=False, repr=False)
class Value:
    """An SSA value: a graph input (``kind`` set) or the ``index``-th output of ``producer``."""

    name: str
    type: Type
    producer: Node | None = None
    index: int = 0
    kind: str | None = None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


LiteralValue: TypeAlias = int | float | bool | sympy.Expr | None
Operand: TypeAlias = Value | LiteralValue
AttrValue = (
    Any  # int | float | bool | str | None | torch.dtype | sympy.Expr | tuple[AttrValue, ...]
)


@dataclass(eq=False, repr=False)
class Node:
    id: int
    op: str
    inputs: tuple[Operand, ...]
    attrs: dict[str, AttrValue]
    outputs: tuple[Value, ...] = ()

    def input_values(self) -> Iterator[Value]:
        for operand in self.inputs:
            if isinstance(operand, Value):
                yield operand

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        return f"<node {self.id}: {outs} = {self.op}>"


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
        raise KeyError(f"graph has no input named {name!r}")

    def inputs_of_kind(self, kind: str) -> list[Value]:
        return [v for v in self.inputs if v.kind == kind]

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
        from plait.ir.text import to_text

        return to_text(self)

    __repr__ = __str__


class GraphBuilder:
    """Builds graphs by hand; output types come from each op's type rule."""

    def __init__(self) -> None:
        self.graph = Graph()
        self._names: set[str] = set()
        self._counter = 0

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
            raise ValueError(f"value name %{name} is already defined")
        self._names.add(name)
        return name

    def input(self, name: str, type: Type, kind: str = "user") -> Value:
        if kind not in INPUT_KINDS:
            raise ValueError(f"input kind must be one of {INPUT_KINDS}, got {kind!r}")
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
        from plait.ir.ops import get_op

        opdef = get_op(op)
        flat, full_attrs, out_types = opdef.infer(inputs, attrs)
        node = Node(self.graph.next_node_id(), opdef.name, flat, full_attrs)
        if names is not None and len(names) != len(out_types):
            raise ValueError(f"{op} has {len(out_types)} outputs, got {len(names)} names")
        node.outputs = tuple(
            Value(self._fresh(names[i] if names else None), t, node, i)
            for i, t in enumerate(out_types)
        )
        self.graph.nodes.append(node)
        if opdef.fixed_outputs == 1:
            return node.outputs[0]
        return node.outputs

    def output(self, *values: Operand) -> None:
        self.graph.outputs.extend(values)

    def build(self, verify: bool = True) -> Graph:
        if verify:
            from plait.ir.verify import verify as run_verify

            run_verify(self.graph)
        return self.graph


def value_map(graph: Graph) -> Mapping[str, Value]:
    out = {v.name: v for v in graph.inputs}
    for n in graph.nodes:
        for v in n.outputs:
            out[v.name] = v
    return out

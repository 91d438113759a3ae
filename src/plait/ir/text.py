"""The IR's text form, printed: :func:`to_text` (:func:`plait.ir.parser.from_text` parses it back).

The round trip is exact: ``to_text(from_text(to_text(g))) == to_text(g)``. Attributes equal to
their declared default are left out of the text; the parser fills them back in.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, to_text, from_text
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((2, 3), torch.float32))
    >>> b.output(b.call("sum", x, dims=[1]))
    >>> print(to_text(b.build()))
    graph(
      user %x: f32[2, 3]
    ) {
      %0 = sum(%x) {dims=[1]} : f32[2]
      return %0
    }
    >>> to_text(from_text(to_text(b.graph))) == to_text(b.graph)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from plait.ir.literals import format_value, same_attr
from plait.ir.ops.registry import get_op
from plait.ir.ssa import Node, Operand, Value
from plait.ir.types import Type


class GraphLike(Protocol):
    """What printing reads of a graph (:class:`plait.ir.graph.Graph`, which prints itself with
    :func:`to_text` and so sits above this module)."""

    @property
    def inputs(self) -> Sequence[Value]: ...

    @property
    def nodes(self) -> Sequence[Node]: ...

    @property
    def outputs(self) -> Sequence[Operand]: ...


def format_type(t: Type) -> str:
    """The text of a type (``f32[2, s0]@cuda:0``)."""
    return str(t)


def format_operand(o: Operand) -> str:
    """The text of an operand: ``%name`` or a literal."""
    return f"%{o.name}" if isinstance(o, Value) else format_value(o)


def format_attrs(attrs: Mapping[str, Any]) -> str:
    """The text of a node's attributes (`` {k=v, ...}``; empty when there are none)."""
    if not attrs:
        return ""
    return " {" + ", ".join(f"{k}={format_value(v)}" for k, v in attrs.items()) + "}"


def node_text(
    node: Node, name: Callable[[Value], str], attrs: Mapping[str, Any] | None = None
) -> str:
    outs = ", ".join(f"%{name(v)}" for v in node.outputs)
    args = ", ".join(
        f"%{name(o)}" if isinstance(o, Value) else format_value(o) for o in node.inputs
    )
    types = ", ".join(format_type(v.type) for v in node.outputs)
    return (
        f"{outs} = {node.op}({args}){format_attrs(node.attrs if attrs is None else attrs)}"
        f" : {types}"
    )


def _non_default_attrs(node: Node) -> dict[str, Any]:
    try:
        opdef = get_op(node.op)
    except KeyError:
        return dict(node.attrs)
    defaults = {a.name: a.default for a in opdef.attrs if not a.required}
    return {
        k: v for k, v in node.attrs.items() if k not in defaults or not same_attr(v, defaults[k])
    }


def to_text(graph: GraphLike) -> str:
    """The text of ``graph`` (attributes equal to their op's default left out)."""
    lines = ["graph("]
    lines += [f"  {v.kind} %{v.name}: {format_type(v.type)}" for v in graph.inputs]
    lines.append(") {")
    lines += ["  " + node_text(n, lambda v: v.name, _non_default_attrs(n)) for n in graph.nodes]
    lines.append("  return " + ", ".join(format_operand(o) for o in graph.outputs))
    lines.append("}")
    return "\n".join(lines)

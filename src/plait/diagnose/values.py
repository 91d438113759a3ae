"""Every value of a graph, materialized: the reference interpreter node by node, keeping each
node's results by value name, with a hook that may judge and replace them as they appear.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((3,), torch.float32))
    >>> y = gb.call("mul", x, 2.0)
    >>> gb.output(gb.call("add", y, 1.0))
    >>> values = evaluate(gb.build(), {"x": torch.ones(3)})
    >>> values[y.name].tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plait.errors import UnknownKeyError
from plait.ir import Graph, Node, Value, get_op

# NOTE: a hook sees each node with the arguments it ran on and its results; it returns the
# results to keep (the same ones, or replacements), or None to keep them as they are.
NodeHook = Callable[[Node, list[Any], list[Any]], Sequence[Any] | None]
# NOTE: how a node's arguments are chosen: given the node and the values so far, the value of
# each operand (None: the node's own operand as computed).
ArgsHook = Callable[[Node, dict[str, Any]], list[Any] | None]


def evaluate(
    graph: Graph,
    inputs: Mapping[str, Any],
    *,
    after: NodeHook | None = None,
    args_of: ArgsHook | None = None,
) -> dict[str, Any]:
    """Run ``graph`` on ``inputs`` (by name; its constants fill ``const`` inputs it is not
    given) and return every value by name. Static shapes only (attributes are concrete)."""
    values: dict[str, Any] = {}
    for v in graph.inputs:
        if v.name in inputs:
            values[v.name] = inputs[v.name]
        elif v.name in graph.constants:
            values[v.name] = graph.constants[v.name]
        else:
            raise UnknownKeyError(f"no value for graph input %{v.name}")
    for node in graph.nodes:
        args = args_of(node, values) if args_of is not None else None
        if args is None:
            args = [values[o.name] if isinstance(o, Value) else o for o in node.inputs]
        results = list(get_op(node.op).run(args, dict(node.attrs)))
        if after is not None:
            kept = after(node, args, results)
            if kept is not None:
                results = list(kept)
        for v, r in zip(node.outputs, results):
            values[v.name] = r
    return values


def producers(graph: Graph) -> dict[str, Node]:
    """Value name -> the node that produces it."""
    return {v.name: n for n in graph.nodes for v in n.outputs}


def dead_code_eliminated(graph: Graph) -> Graph:
    """``graph`` (a copy) without the nodes and inputs no output depends on."""
    out = graph.copy()
    needed = {id(o) for o in out.outputs if isinstance(o, Value)}
    kept: list[Node] = []
    for node in reversed(out.nodes):
        if any(id(v) in needed for v in node.outputs):
            kept.append(node)
            needed.update(id(v) for v in node.input_values())
    out.nodes = kept[::-1]
    out.inputs = [v for v in out.inputs if id(v) in needed]
    names = {v.name for v in out.inputs}
    out.constants = {k: t for k, t in out.constants.items() if k in names}
    return out

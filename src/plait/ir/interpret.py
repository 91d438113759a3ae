"""The reference interpreter: runs each node's PyTorch reference implementation in order.

It is the oracle for every later stage and the ``eager`` backend.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, interpret
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float32))
    >>> b.output(b.call("mul", x, 2.0))
    >>> interpret(b.build(), [torch.ones(3)])
    [tensor([2., 2., 2.])]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from plait.ir.graph import Graph, Value
from plait.ir.ops.registry import get_op
from plait.ir.types import TensorType
from plait.symbolic import Dim, evaluate, normalize


class InterpretError(RuntimeError):
    """Bad inputs for a graph, or a node whose result disagrees with its declared type."""


def bind_inputs(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any]) -> dict[str, int]:
    """Check concrete inputs against the graph's input types; return the symbol bindings."""
    if isinstance(inputs, Mapping):
        inputs = {**graph.constants, **inputs}
        missing = [v.name for v in graph.inputs if v.name not in inputs]
        if missing:
            raise InterpretError(f"missing graph inputs: {missing}")
        values = [inputs[v.name] for v in graph.inputs]
    else:
        values = list(inputs)
        if len(values) != len(graph.inputs):
            raise InterpretError(
                f"graph takes {len(graph.inputs)} inputs "
                f"({', '.join(v.name for v in graph.inputs)}), got {len(values)}"
            )
    bindings: dict[str, int] = {}
    for v, x in zip(graph.inputs, values):
        if isinstance(v.type, TensorType):
            check_tensor(f"input %{v.name}", v.type, x, bindings)
    return bindings


def check_tensor(where: str, t: TensorType, x: Any, bindings: dict[str, int]) -> None:
    if not isinstance(x, torch.Tensor):
        raise InterpretError(f"{where}: expected a tensor of type {t}, got {type(x).__name__}")
    if x.dtype != t.dtype or x.dim() != t.rank:
        raise InterpretError(f"{where}: expected {t}, got {x.dtype} of rank {x.dim()}")
    if TensorType.of(x).device != t.device:
        raise InterpretError(f"{where}: expected device {t.device}, got {x.device}")
    for i, (d, n) in enumerate(zip(t.shape, x.shape)):
        if not _dim_matches(d, int(n), bindings):
            raise InterpretError(f"{where}: dim {i} is {n}, expected {d} (type {t})")


def _dim_matches(d: Dim, n: int, bindings: dict[str, int]) -> bool:
    if isinstance(d, int):
        return d == n
    if d.is_Symbol:
        name = str(d)
        if name in bindings:
            return bindings[name] == n
        bindings[name] = n
        return True
    value = normalize(d.subs({s: bindings[str(s)] for s in d.free_symbols if str(s) in bindings}))
    return not isinstance(value, int) or value == n


def interpret(
    graph: Graph, inputs: Sequence[Any] | Mapping[str, Any], check_types: bool = True
) -> list[Any]:
    """Run ``graph`` on concrete inputs (in input order, or by name); returns the outputs.

    Given by name, ``const`` inputs default to the graph's own ``constants``.
    """
    bindings = bind_inputs(graph, inputs)
    values: dict[int, Any] = {}
    ordered = inputs
    if isinstance(inputs, Mapping):
        named = {**graph.constants, **inputs}
        ordered = [named[v.name] for v in graph.inputs]
    for v, x in zip(graph.inputs, ordered):
        values[id(v)] = x
    last_use = _last_uses(graph)
    for step, node in enumerate(graph.nodes):
        opdef = get_op(node.op)
        args = [
            values[id(o)] if isinstance(o, Value) else _concrete(o, bindings) for o in node.inputs
        ]
        results = opdef.run(args, {k: _concrete(v, bindings) for k, v in node.attrs.items()})
        if len(results) != len(node.outputs):
            raise InterpretError(
                f"node {node.id} ({node.op}) returned {len(results)} values, "
                f"declared {len(node.outputs)}"
            )
        for v, r in zip(node.outputs, results):
            if check_types and isinstance(v.type, TensorType):
                check_tensor(f"node {node.id} ({node.op}) output %{v.name}", v.type, r, bindings)
            values[id(v)] = r
        for o in {id(v): v for v in node.input_values()}.values():
            if last_use.get(id(o)) == step and o.producer is not None:
                del values[id(o)]
    return [values[id(o)] if isinstance(o, Value) else o for o in graph.outputs]


def _concrete(value: Any, bindings: dict[str, int]) -> Any:
    """Symbolic sizes in attributes and literal operands, evaluated for this call."""
    if isinstance(value, sympy.Expr):
        return evaluate(value, bindings)
    if isinstance(value, tuple):
        return tuple(_concrete(v, bindings) for v in value)
    return value


def _last_uses(graph: Graph) -> dict[int, int]:
    """Step after which a value is dead (graph outputs never die)."""
    out: dict[int, int] = {}
    for step, node in enumerate(graph.nodes):
        for v in node.input_values():
            out[id(v)] = step
    for o in graph.outputs:
        if isinstance(o, Value):
            out.pop(id(o), None)
    return out

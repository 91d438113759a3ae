"""Delta debugging over a graph: the smallest graph on which a divergence persists.

Three reductions, each kept only while the divergence persists (``still_diverges``):

1. *outputs*: the graph returns only the divergent value (dead code eliminated);
2. *cuts*: a value computed by a node becomes a graph input holding the value the reference
   computed for it (so what fed it is dropped): first every operand of the divergent node at
   once (a single-node bug shrinks to one node at once), then each value, nearest first;
3. *shapes*: each input dimension is halved (the inputs sliced, every type recomputed by the
   ops' own type rules; a node whose rule refuses the smaller shape keeps it).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.diagnose.values import evaluate
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((8, 8), torch.float32))
    >>> y = gb.call("exp", gb.call("relu", gb.call("mul", x, 2.0)))
    >>> gb.output(gb.call("neg", y))
    >>> g = gb.build()
    >>> values = evaluate(g, {"x": torch.randn(8, 8)})
    >>> small = shrink(g, values, y.name, lambda g, i: any(n.op == "exp" for n in g.nodes))
    >>> [n.op for n in small.graph.nodes], tuple(small.inputs[small.graph.inputs[0].name].shape)
    (['exp'], (1, 1))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from plait.diagnose.values import dead_code_eliminated
from plait.ir import Graph, Node, TensorType, Value, get_op, verify

# NOTE: the predicate gets a candidate graph and the values of its inputs (by name).
StillDiverges = Callable[[Graph, dict[str, Any]], bool]


@dataclass
class Shrunk:
    graph: Graph
    inputs: dict[str, Any]
    tries: int
    seconds: float


def shrink(
    graph: Graph,
    values: Mapping[str, Any],
    target: str,
    still_diverges: StillDiverges,
    *,
    seconds: float = 60.0,
) -> Shrunk:
    """Shrink ``graph`` around the value named ``target`` while ``still_diverges`` holds.

    ``values`` holds the reference value of every value of ``graph`` by name (inputs
    included): what a cut input holds. Stops reducing after ``seconds``."""
    start = time.perf_counter()
    tries = 0
    values = dict(values)  # NOTE: shape reduction replaces the inputs' entries

    def accept(candidate: Graph | None) -> bool:
        nonlocal tries
        if candidate is None or time.perf_counter() - start > seconds:
            return False
        tries += 1
        try:
            verify(candidate)
            return bool(still_diverges(candidate, _inputs_of(candidate, values)))
        except Exception:  # NOTE: a candidate that fails otherwise is not this bug
            return False

    current = _returning(graph, target)
    if not accept(current):
        current = graph  # NOTE: the divergence needs more than the target: keep every output
    producer = _producers(current).get(target)
    if producer is not None:
        operands = [v.name for v in producer.input_values() if v.producer is not None]
        candidate = _cut(current, operands, values)
        if operands and accept(candidate):
            assert candidate is not None
            current = candidate
    changed = True
    while changed and time.perf_counter() - start < seconds:
        changed = False
        for name in _cuttable(current, target):
            if name not in _producers(current):
                continue
            candidate = _cut(current, [name], values)
            if accept(candidate):
                assert candidate is not None
                current, changed = candidate, True
    inputs = _inputs_of(current, values)
    current, inputs = _shrink_shapes(current, inputs, accept, values)
    return Shrunk(current, inputs, tries, time.perf_counter() - start)


def _producers(graph: Graph) -> dict[str, Node]:
    return {v.name: n for n in graph.nodes for v in n.outputs}


def _returning(graph: Graph, target: str) -> Graph:
    out = graph.copy()
    made = {v.name: v for n in out.nodes for v in n.outputs}
    made.update({v.name: v for v in out.inputs})
    out.outputs = [made[target]]
    return dead_code_eliminated(out)


def _cuttable(graph: Graph, target: str) -> list[str]:
    """Values computed by nodes, nearest the output first (never the target itself)."""
    names = [v.name for n in graph.nodes for v in n.outputs if v.name != target]
    return names[::-1]


def _const_derived(graph: Graph) -> set[str]:
    out = {v.name for v in graph.inputs if v.kind == "const"}
    for n in graph.nodes:
        vals = list(n.input_values())
        if vals and all(v.name in out for v in vals):
            out.update(v.name for v in n.outputs)
    return out


def _cut(graph: Graph, names: list[str], values: Mapping[str, Any]) -> Graph | None:
    """``graph`` with the values ``names`` turned into inputs (dead code eliminated)."""
    if any(not isinstance(values.get(n), torch.Tensor) for n in names):
        return None
    out = graph.copy()
    consts = _const_derived(out)
    by_name = {v.name: v for n in out.nodes for v in n.outputs}
    for name in names:
        v = by_name[name]
        node = v.producer
        assert node is not None
        kind = "const" if name in consts else "user"
        cut = Value(v.name, v.type, kind=kind)
        if kind == "const":
            out.constants[name] = values[name]
        out.inputs.append(cut)
        for n in out.nodes:
            if any(o is v for o in n.inputs):
                n.inputs = tuple(cut if o is v else o for o in n.inputs)
        out.outputs = [cut if o is v else o for o in out.outputs]
    return dead_code_eliminated(out)


def _inputs_of(graph: Graph, values: Mapping[str, Any]) -> dict[str, Any]:
    return {v.name: values[v.name] for v in graph.inputs if v.name in values}


def _shrink_shapes(
    graph: Graph,
    inputs: dict[str, Any],
    accept: Callable[[Graph | None], bool],
    values: dict[str, Any],
) -> tuple[Graph, dict[str, Any]]:
    """Halve input dims while the divergence persists. ``values`` (what ``accept`` gives the
    predicate) holds the sliced inputs while a candidate is tried, and those kept after."""
    sizes = sorted(
        {int(n) for t in inputs.values() if isinstance(t, torch.Tensor) for n in t.shape if n > 1},
        reverse=True,
    )
    for size in sizes:  # NOTE: first every dim of that size at once (a shared channel count)
        while size > 1:
            trial = {
                k: _halved(t, size) if isinstance(t, torch.Tensor) else t for k, t in inputs.items()
            }
            if not _try(graph, inputs, trial, accept, values):
                break
            graph, inputs, size = _retyped(graph, trial) or graph, trial, size // 2
    for v in list(graph.inputs):
        t = inputs.get(v.name)
        if not isinstance(t, torch.Tensor):
            continue
        for dim in range(t.dim()):
            while inputs[v.name].shape[dim] > 1:
                small = inputs[v.name].narrow(dim, 0, inputs[v.name].shape[dim] // 2)
                trial = {**inputs, v.name: small}
                if not _try(graph, inputs, trial, accept, values):
                    break
                graph, inputs = _retyped(graph, trial) or graph, trial
    return graph, inputs


def _halved(t: torch.Tensor, size: int) -> torch.Tensor:
    for dim, n in enumerate(t.shape):
        if n == size:
            t = t.narrow(dim, 0, size // 2)
    return t


def _try(
    graph: Graph,
    inputs: dict[str, Any],
    trial: dict[str, Any],
    accept: Callable[[Graph | None], bool],
    values: dict[str, Any],
) -> bool:
    """Does the divergence persist on ``graph`` retyped for the ``trial`` inputs? ``values``
    holds the trial inputs while it is tried, and keeps them only if it does."""
    candidate = _retyped(graph, trial)
    if candidate is None:
        return False
    values.update(trial)
    if accept(candidate):
        return True
    values.update(inputs)
    return False


def _retyped(graph: Graph, inputs: Mapping[str, Any]) -> Graph | None:
    """``graph`` with input types read from ``inputs`` and every node's types recomputed by
    its op's type rule; None where a rule refuses, or a result changes dtype or rank."""
    out = graph.copy()
    for v in out.inputs:
        t = inputs.get(v.name)
        if isinstance(t, torch.Tensor) and isinstance(v.type, TensorType):
            v.type = TensorType(tuple(t.shape), v.type.dtype, v.type.device)
    for name in list(out.constants):
        if name in inputs:
            out.constants[name] = inputs[name]
    try:
        for n in out.nodes:
            types = get_op(n.op).output_types(n.inputs, n.attrs)
            for v, t in zip(n.outputs, types):
                old = v.type
                if isinstance(old, TensorType) and isinstance(t, TensorType):  # noqa: SIM102
                    if t.dtype != old.dtype or t.rank != old.rank:
                        return None
                v.type = t
    except Exception:  # NOTE: a type rule refusing the smaller shape
        return None
    return out

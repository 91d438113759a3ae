"""Freezing and constant folding.

``freeze`` turns parameter and buffer inputs into ``const`` inputs whose tensors the graph holds
(``graph.constants``); the caller guards each frozen tensor by identity and version counter, so a
weight changed in place leads to a recompile, never a stale answer. ``const-fold`` evaluates, with
each op's reference implementation, every node whose tensor operands are all constants.
"""

from __future__ import annotations

from typing import Any

import torch

from plait.errors import InvalidArgumentTypeError
from plait.ir import Category, Graph, Node, TensorType, Value, get_op
from plait.passes.manager import EXACT, PassContext, register_pass
from plait.passes.rewrite import replace_uses

# NOTE: folding may not inflate memory: a folded result larger than this many elements (and
# larger than its constant operands together) stays a computation (e.g. an expand).
MAX_FOLDED_ELEMENTS = 1 << 16


@register_pass("freeze", EXACT, rules=("freeze.param",))
def freeze(graph: Graph, ctx: PassContext) -> Graph:
    """Make the parameters and buffers named in ``ctx.params`` graph constants.

    Option ``kinds`` (default ``("param", "buffer")``) picks which input kinds freeze. Buffers a
    graph writes back (its outputs) never freeze.
    """
    kinds = tuple(ctx.option("kinds", ("param", "buffer")))
    written = {id(o) for o in graph.outputs if isinstance(o, Value)}
    frozen = []
    for v in graph.inputs:
        if v.kind in kinds and v.name in ctx.params and id(v) not in written:
            tensor = ctx.params[v.name]
            if not isinstance(tensor, torch.Tensor):
                raise InvalidArgumentTypeError(f"freeze: {v.name} is not a tensor")
            graph.constants[v.name] = tensor.detach()
            v.kind = "const"
            frozen.append(v.name)
            ctx.record.fired("freeze.param", [], [])
    ctx.record.details["frozen"] = frozen
    return graph


def _symbolic(x: Any) -> bool:
    """A size expression (a sympy one: the past length of a key/value cache), known per call."""
    if isinstance(x, (list, tuple)):
        return any(_symbolic(i) for i in x)
    return bool(getattr(x, "free_symbols", None))


def _is_constant(o: Any, graph: Graph) -> bool:
    if not isinstance(o, Value):
        return not _symbolic(o)
    if o.producer is None:
        return o.kind == "const" and o.name in graph.constants
    return get_op(o.producer.op).category is Category.CONSTANT


def _foldable(node: Node, graph: Graph) -> bool:
    opdef = get_op(node.op)
    if opdef.category in (Category.CONSTANT, Category.OPAQUE) or opdef.is_random(node.attrs):
        return False
    values = list(node.input_values())
    if not values or not all(_is_constant(o, graph) for o in node.inputs):
        return False
    if any(not isinstance(v.type, TensorType) or not v.type.is_static for v in values):
        return False  # NOTE: a symbolic size (arange(0, t)) is known per call: nothing to fold
    if any(_symbolic(a) for a in node.attrs.values()):
        return False
    budget = max(MAX_FOLDED_ELEMENTS, sum(_numel(v) for v in values))
    return all(_numel(v) <= budget for v in node.outputs)


def _numel(v: Value) -> int:
    t = v.type
    if not isinstance(t, TensorType) or not t.is_static:
        return 1 << 62
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


def _evaluate(o: Any, graph: Graph, cache: dict[int, Any]) -> Any:
    if not isinstance(o, Value):
        return o
    if id(o) not in cache:
        if o.producer is None:
            cache[id(o)] = graph.constants[o.name]
        else:
            node = o.producer
            args = [_evaluate(i, graph, cache) for i in node.inputs]
            for v, r in zip(node.outputs, get_op(node.op).run(args, node.attrs)):
                cache[id(v)] = r
    return cache[id(o)]


@register_pass("const-fold", EXACT, rules=("const-fold.node",))
def const_fold(graph: Graph, ctx: PassContext) -> Graph:
    """Evaluate nodes whose operands are all constants; results become ``const`` inputs.

    Bitwise: the folded value is what the same reference kernel computes at run time.
    """
    cache: dict[int, Any] = {}
    taken = {v.name for v in graph.inputs} | {v.name for n in graph.nodes for v in n.outputs}
    for node in list(graph.nodes):
        if not _foldable(node, graph):
            continue
        results = [_evaluate(v, graph, cache) for v in node.outputs]
        mapping = {}
        for v, r in zip(node.outputs, results):
            name = f"_folded.{node.id}.{v.index}"
            while name in taken:
                name = "_" + name
            taken.add(name)
            const = Value(name, v.type, kind="const")
            graph.inputs.append(const)
            graph.constants[name] = r
            mapping[id(v)] = const
        replace_uses(graph, mapping)
        graph.nodes.remove(node)
        ctx.record.fired("const-fold.node", [node.id], [])
    return graph

"""Dead code elimination and common subexpression elimination (both keep results bitwise)."""

from __future__ import annotations

from plait.ir import Graph, Node, Value, get_op
from plait.ir.literals import format_value
from plait.passes.manager import EXACT, PassContext, register_pass
from plait.passes.rewrite import replace_uses


def _is_random(node: Node) -> bool:
    return get_op(node.op).is_random(node.attrs)


@register_pass("dce", EXACT, rules=("dce.dead-node", "dce.unused-const"))
def dce(graph: Graph, ctx: PassContext) -> Graph:
    """Remove nodes whose results nobody reads.

    NOTE: an unused random node is kept when a later random node exists: removing it would shift
    the RNG stream that the later one draws from.
    """
    live: set[int] = {id(o) for o in graph.outputs if isinstance(o, Value)}
    later_random = False
    kept = []
    for node in reversed(graph.nodes):
        used = any(id(v) in live for v in node.outputs)
        random = _is_random(node)
        if used or (random and later_random):
            kept.append(node)
            live.update(id(v) for v in node.input_values())
        else:
            ctx.record.fired("dce.dead-node", [node.id], [])
        later_random = later_random or random
    graph.nodes = kept[::-1]
    # compiler-owned constants nobody reads are dropped with their tensors
    for v in list(graph.inputs):
        if v.kind == "const" and v.name in graph.constants and id(v) not in live:
            graph.inputs.remove(v)
            del graph.constants[v.name]
            ctx.record.fired("dce.unused-const", [], [])
            ctx.record.details.setdefault("dropped_constants", []).append(v.name)
    return graph


def _key(node: Node) -> tuple[object, ...]:
    operands = tuple(
        ("v", id(o)) if isinstance(o, Value) else ("lit", type(o).__name__, format_value(o))
        for o in node.inputs
    )
    attrs = tuple((k, type(v).__name__, format_value(v)) for k, v in node.attrs.items())
    return (node.op, operands, attrs)


@register_pass("cse", EXACT, rules=("cse.duplicate",))
def cse(graph: Graph, ctx: PassContext) -> Graph:
    """Merge nodes that compute the same op on the same operands with the same attributes.

    NOTE: never over random ops: two draws are two different values.
    """
    seen: dict[tuple[object, ...], Node] = {}
    kept = []
    for node in graph.nodes:
        if _is_random(node):
            kept.append(node)
            continue
        key = _key(node)
        first = seen.get(key)
        if first is None:
            seen[key] = node
            kept.append(node)
            continue
        replace_uses(graph, {id(v): w for v, w in zip(node.outputs, first.outputs)})
        ctx.record.fired("cse.duplicate", [node.id], [])
    graph.nodes = kept
    return graph

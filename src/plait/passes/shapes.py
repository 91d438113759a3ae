"""Shape propagation: re-derive every node's output types from its op's type rule.

Run it after a graph's input types change (for example dims made symbolic, or specialized back
to sizes); it works on symbolic dims, since type rules do.
"""

from __future__ import annotations

from plait.ir import Graph, get_op
from plait.passes.manager import EXACT, PassContext, register_pass


@register_pass("shape-prop", EXACT, rules=("shape-prop.retype",))
def shape_prop(graph: Graph, ctx: PassContext) -> Graph:
    """Recompute output types in order; record each node whose types changed."""
    for node in graph.nodes:
        types = get_op(node.op).output_types(node.inputs, node.attrs)
        if [str(t) for t in types] != [str(v.type) for v in node.outputs]:
            for v, t in zip(node.outputs, types):
                v.type = t
            ctx.record.fired("shape-prop.retype", [node.id], [node.id])
    return graph

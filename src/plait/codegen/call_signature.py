"""Call signatures: what decides an extern call's result layout and whether oneDNN accepts it.

The planner runs each extern call once at compile time (a dry run on placeholder values, or a
probe on fresh tensors) to learn the strides PyTorch gives its result and whether oneDNN accepts
the call. Both depend on the call's metadata alone: the op, its attributes, what the call fuses
(its ``detail``), and each operand's shape, dtype, strides and storage offset; never on the
values. A program's repeated blocks (a transformer's layers, a ResNet's bottlenecks) repeat
signatures: the planner runs the first call of each signature and reuses its outcome for the rest.

Invariant: a call whose outcome may depend on more than that metadata has no signature (``None``)
and is always run: opaque calls (arbitrary Python), random calls (running them draws), runtime
checks (they raise on placeholder values) and calls that make or read data-dependent sizes.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> w = gb.input("w", TensorType((8, 8), torch.float32))
    >>> gb.output(gb.call("linear", x, w))
    >>> node = gb.build().nodes[0]
    >>> meta = {v: ((4, 8), (8, 1), 0) for v in node.input_values()}
    >>> call_signature(node, "oneDNN linear", meta.get) is not None
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plait.ir.graph import Node, Value
from plait.ir.ops import get_op

# NOTE: ops whose calls are never remembered (see the module's invariant)
UNREMEMBERED = frozenset({"opaque", "aten_check", "aten_datadep"})

# (shape, strides, storage offset) of an operand as the call receives it; None: unknown
Layout = tuple[tuple[int, ...], tuple[int, ...], int]


def call_signature(
    node: Node,
    detail: str,
    layout_of: Callable[[Value], Layout | None],
    extra: Sequence[Value] = (),
    inputs: Sequence[object] | None = None,
) -> tuple[object, ...] | None:
    """The signature of ``node``'s call (``detail``: what the call does, fused post-ops
    included), or ``None`` when its outcome must not be reused (see the module's invariant, and
    an operand whose layout is unknown). ``inputs``: what the call reads in place of the node's
    inputs (a call with fused prologue nodes reads their source)."""
    if node.op in UNREMEMBERED or get_op(node.op).is_random(node.attrs):
        return None
    parts: list[object] = []
    for operand in (*(node.inputs if inputs is None else inputs), *extra):
        if isinstance(operand, Value):
            layout = layout_of(operand)
            if layout is None:
                return None
            parts.append((str(operand.type), layout))
        else:
            parts.append(("literal", type(operand).__name__, repr(operand)))
    attrs = repr(sorted((k, repr(v)) for k, v in node.attrs.items()))
    return (node.op, attrs, detail, tuple(parts))

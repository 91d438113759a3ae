"""The verifier: SSA, types against each op's own type rule, attributes.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType, verify
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float32))
    >>> b.output(b.call("exp", x))
    >>> verify(b.build(verify=False))  # raises VerificationError when something is wrong
"""

from __future__ import annotations

from typing import Any

from plait.ir.graph import INPUT_KINDS, Graph, Node, Value
from plait.ir.literals import same_attr
from plait.ir.ops.registry import AttrError, TypeRuleError, get_op


class VerificationError(ValueError):
    """A graph breaks an IR invariant. ``node`` is the offending node (None for graph-level)."""

    def __init__(self, rule: str, message: str, node: Node | None = None) -> None:
        where = (
            f"node {node.id} ({node.op}, defines {', '.join('%' + v.name for v in node.outputs)})"
            if node is not None
            else "graph"
        )
        super().__init__(f"[{rule}] {where}: {message}")
        self.rule = rule
        self.node = node


def verify(graph: Graph) -> None:
    """Check every IR invariant; raise :class:`VerificationError` naming the first one broken."""
    defined: set[int] = set()
    names: set[str] = set()

    def define(v: Value, node: Node | None) -> None:
        if v.name in names:
            raise VerificationError("ssa", f"value %{v.name} is defined twice", node)
        names.add(v.name)
        defined.add(id(v))

    for v in graph.inputs:
        if v.kind not in INPUT_KINDS:
            raise VerificationError(
                "input-kind", f"input %{v.name} has kind {v.kind!r}; expected one of {INPUT_KINDS}"
            )
        if v.producer is not None:
            raise VerificationError("ssa", f"input %{v.name} has a producer node")
        define(v, None)
    seen_ids: set[int] = set()
    for node in graph.nodes:
        if node.id in seen_ids:
            raise VerificationError("node-id", f"node id {node.id} is used twice", node)
        seen_ids.add(node.id)
        for i, operand in enumerate(node.inputs):
            if isinstance(operand, Value) and id(operand) not in defined:
                raise VerificationError(
                    "ssa", f"operand {i} (%{operand.name}) is not defined before its use", node
                )
        try:
            opdef = get_op(node.op)
        except KeyError as exc:
            raise VerificationError("op", str(exc.args[0]), node) from None
        try:
            full = opdef.check_attrs(node.attrs)
        except (AttrError, TypeRuleError) as exc:
            raise VerificationError("attrs", str(exc), node) from None
        if not _attrs_identical(full, node.attrs):
            raise VerificationError(
                "attrs",
                f"attributes {node.attrs} are not in canonical form "
                f"{full} (missing defaults or non-canonical values)",
                node,
            )
        try:
            expected = opdef.output_types(node.inputs, node.attrs)
        except (TypeRuleError, AttrError, ValueError, TypeError) as exc:
            raise VerificationError(
                "type-rule", f"the type rule rejects the operands: {exc}", node
            ) from None
        actual = tuple(v.type for v in node.outputs)
        if len(expected) != len(actual):
            raise VerificationError(
                "type", f"{len(actual)} outputs, the type rule gives {len(expected)}", node
            )
        for i, (e, a) in enumerate(zip(expected, actual)):
            if str(e) != str(a):
                raise VerificationError(
                    "type",
                    f"output {i} (%{node.outputs[i].name}) has type {a}, the type rule gives {e}",
                    node,
                )
        for i, v in enumerate(node.outputs):
            if v.producer is not node or v.index != i:
                raise VerificationError(
                    "ssa", f"output %{v.name} does not point back at its node", node
                )
            define(v, node)
    for i, out in enumerate(graph.outputs):
        if isinstance(out, Value) and id(out) not in defined:
            raise VerificationError("ssa", f"graph output {i} (%{out.name}) is not defined")


def _attrs_identical(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return list(a) == list(b) and all(same_attr(a[k], b[k]) for k in a)

"""The IR nodes of one faithful ATen graph (:mod:`plait.frontend.aten_graph`), written into
the capture's graph: each ATen node becomes the IR op the ATen -> IR table
(:mod:`plait.frontend.aten_table`) names for it, else a typed ``aten`` extern node (``aten_check``
for a runtime check) whose types come from the overload's meta kernel.

NOTE: an emitted node must have the type the traced graph's meta value has; a node of another
type is left dead (the native form) or refuses the graph (the extern form).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from plait.frontend.aten_graph import (
    functional_form,
    input_write,
    node_arg,
    out_of_place,
    rebinding,
    same_tensor_nodes,
    tensor_root,
)
from plait.frontend.aten_table import emit_native
from plait.frontend.call_encoding import NotLiteral, call_spec
from plait.ir import TensorType, Value, get_op
from plait.ir.ops import AttrError, TypeRuleError
from plait.ir.ops.aten import (
    CHECK_TOKEN,
    RUNTIME_CHECKS,
    is_seeded,
    output_mask,
    overload_name,
)

if TYPE_CHECKING:
    from plait.frontend.capture_values import Tracer
    from plait.frontend.tracer import CaptureContext


def _plain(x: Any) -> Any:
    """fx's immutable lists and dicts as Python lists and dicts (tuples stay tuples)."""
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


class AtenEmitter:
    """Writes the IR nodes of one ATen graph into the capture's graph."""

    def __init__(self, cx: CaptureContext, gm: torch.fx.GraphModule, inputs: list[Tracer]):
        self.cx = cx
        # NOTE: whether a gradient flows through the call (eager autograd differentiates the
        # nodes' reference calls then)
        self.grad = cx.grad_enabled and any(t._rg for t in inputs)
        self.gm = gm
        self.inputs = inputs
        self.env: dict[torch.fx.Node, Any] = {}
        self.members = same_tensor_nodes(gm)
        self.placeholders: list[torch.fx.Node] = []
        # NOTE: (input position, its new value): functionalization's write-backs of inputs
        self.writes: list[tuple[int, Value]] = []

    def run(self) -> list[Value | None] | str:
        placeholders = iter(self.inputs)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self.cx.value(next(placeholders))
                self.placeholders.append(node)
            elif node.op == "get_attr":
                const = getattr(self.gm, node.target)
                self.env[node] = self.cx.value(self.cx.lift_const(const))
            elif node.op == "call_function":
                if node.target.__module__ == "_operator":  # getitem of a multi-output node
                    self.env[node] = self.env[node.args[0]][node.args[1]]
                    continue
                if input_write(node, set(self.placeholders)):
                    position = self.placeholders.index(node.args[0])
                    self.writes.append((position, self.env[node.args[1]]))
                    continue
                emitted = self.call(node)
                if isinstance(emitted, str):
                    return emitted
                self.env[node] = emitted
            elif node.op == "output":
                results = node.args[0]
                if results is None:
                    return []  # NOTE: a call run for its checks alone (_assert_async)
                leaves = list(results) if isinstance(results, (tuple, list)) else [results]
                return [None if x is None else self.env[x] for x in leaves]
        return "the traced graph has no output"

    def call(self, node: torch.fx.Node) -> Any:
        target: Any = node.target
        if target in RUNTIME_CHECKS:
            return self._aten(node, target, [CHECK_TOKEN], "aten_check")
        found = rebinding(target) if target._schema.is_mutable else None
        op, written = found if found is not None else (functional_form(target), [])
        if op is None:
            return f"aten.{target.__name__} aliases its input and has no _copy form"
        vals = node.meta["val"]
        metas = list(vals) if isinstance(vals, (tuple, list)) else [vals]
        defined = output_mask(target, node.args, node.kwargs)
        if defined is not None and len(defined) == len(metas) and not all(defined):
            return self._partly_defined(node, target, op, written, metas, defined)
        expected = [TensorType.of(v) for v in metas]
        variant = bool(written) and op is not out_of_place(target)  # NOTE: a _functional op
        if variant and self.grad:
            # NOTE: rrelu_with_noise_functional's backward reads the noise argument, not the
            # noise it drew: its gradient is not eager's
            return f"aten.{op.__name__} has no gradient of aten.{target.__name__}'s"
        if variant:
            expected += [TensorType.of(node_arg(node, target, i).meta["val"]) for i in written]
        value = self._native(op, node, expected)
        if value is None:
            value = self._aten(node, op, expected)
        if isinstance(value, str) or not written:
            return value
        if not variant:  # NOTE: an in-place op's new value is its result
            self._rebind(node_arg(node, target, 0), value)
            return value
        results = len(target._schema.returns)
        for i, new in zip(written, value[results:]):
            self._rebind(node_arg(node, target, i), new)
        return value[:results] if isinstance(vals, (tuple, list)) else value[0]

    def _partly_defined(
        self,
        node: torch.fx.Node,
        target: Any,
        op: Any,
        written: list[int],
        metas: list[Any],
        defined: list[bool],
    ) -> Any:
        """A call whose arguments leave some of its results undefined (None in eager, a tensor
        on fake tensors: ``need_weights=False``): a node of the defined ones, None for the
        others."""
        if written:
            return f"aten.{target.__name__} writes its inputs and leaves a result undefined"
        expected = [TensorType.of(v) for v, keep in zip(metas, defined) if keep]
        value = self._aten(node, op, expected)
        if isinstance(value, str):
            return value
        found = iter(value if isinstance(value, list) else [value])
        return [next(found) if keep else None for keep in defined]

    def _rebind(self, written: torch.fx.Node, new: Value) -> None:
        """NOTE: the written tensor is ``new`` from here on, under every node that is it."""
        for m in self.members.get(tensor_root(written), [written]):
            if m in self.env:
                self.env[m] = new

    def _native(self, op: Any, node: torch.fx.Node, expected: list[TensorType]) -> Any:
        if len(expected) != 1 or is_seeded(op):
            return None
        args = _plain(torch.fx.node.map_arg(node.args, lambda n: self.env[n]))
        kwargs = _plain(torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n]))
        try:
            value = emit_native(self.cx.builder, op, tuple(args), dict(kwargs))
        except (TypeRuleError, AttrError, TypeError, ValueError):
            return None
        if value is None or value.type != expected[0]:
            return None  # NOTE: a mismatched node is left dead; dead-code elimination drops it
        return value

    def _aten(
        self, node: torch.fx.Node, op: Any, expected: list[TensorType], kind: str = "aten"
    ) -> Any:
        markers: dict[int, torch.fx.Node] = {}

        def mark(n: torch.fx.Node) -> Any:
            t = torch.empty(0)
            markers[id(t)] = n
            keep.append(t)
            return t

        keep: list[torch.Tensor] = []
        args = _plain(torch.fx.node.map_arg(node.args, mark))
        kwargs = _plain(torch.fx.node.map_arg(node.kwargs, mark))
        if not keep and len(expected) == 1:
            kwargs = _default_dtype_written(op, kwargs, expected[0].dtype)
        try:
            tensors, attrs = call_spec(tuple(args), dict(kwargs))
        except NotLiteral as exc:
            return f"an argument of aten.{op.__name__} has no literal form: {exc}"
        name, overload = overload_name(op)
        operands = [self.env[markers[id(t)]] for t in tensors]
        if kind == "aten" and not operands:
            kind = "aten_factory"
        try:
            if operands:
                values = self.cx.builder.call(kind, operands, name=name, overload=overload, **attrs)
            else:
                values = self.cx.builder.call(kind, name=name, overload=overload, **attrs)
        except (TypeRuleError, AttrError, TypeError, ValueError) as exc:
            return f"plait's {kind} node rejects aten.{op.__name__}: {exc}"
        if [v.type for v in values] != expected:
            return f"the meta kernel of aten.{op.__name__} disagrees with the traced types"
        return (
            list(values)
            if len(expected) > 1 or isinstance(node.meta.get("val"), (tuple, list))
            else values[0]
        )

    def drop_effects(self, first: int) -> None:
        """NOTE: after a refused emission, the random and check nodes it emitted (and what
        reads them) leave the graph: dead, they would still draw or raise."""
        nodes = self.cx.builder.graph.nodes
        gone: set[int] = set()
        kept = nodes[:first]
        for n in nodes[first:]:
            effect = n.op == "aten_check" or get_op(n.op).is_random(n.attrs)
            if effect or any(id(v) in gone for v in n.input_values()):
                gone.update(id(v) for v in n.outputs)
            else:
                kept.append(n)
        nodes[:] = kept


def _default_dtype_written(op: Any, kwargs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """A factory's keywords with the dtype it made written out where the call left it to
    ``torch.get_default_dtype()``: the node then makes that dtype under any default in force
    (where it is typed, run, or loaded from an export)."""
    arg = next((a for a in op._schema.arguments if a.name == "dtype"), None)
    if arg is None or not arg.kwarg_only or kwargs.get("dtype") is not None:
        return kwargs
    if not dtype.is_floating_point:
        return kwargs
    return {**kwargs, "dtype": dtype}

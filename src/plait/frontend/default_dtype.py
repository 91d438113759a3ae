"""Capture under a default dtype other than float32: where eager takes a result's dtype from
``torch.get_default_dtype()`` (an integer tensor times a float, integer true division,
``sqrt`` of integers), the captured graph casts the integer and bool operands to that default
first, so the graph states the dtype itself.

NOTE: the IR's type rules give float32 for the default, whatever the default in force
(``plait.ir.ops.rules``): a graph types the same wherever it is verified, compiled or loaded.
The default a capture ran under is an ambient guard of every specialization
(``frontend.guard_build``), so a call under another default captures again.

Example:
    >>> import torch
    >>> from plait.ir import TensorType
    >>> b = CaptureBuilder(torch.float64)
    >>> i = b.input("i", TensorType((3,), torch.int64))
    >>> y = b.call("mul", i, 0.5)
    >>> y.type.dtype, [n.op for n in b.graph.nodes]
    (torch.float64, ['to_dtype', 'mul'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from plait.ir.builder import GraphBuilder
from plait.ir.graph import Value
from plait.ir.ops.registry import OpDef, TypeRuleError, get_op
from plait.ir.ops.rules import IR_DEFAULT_FLOAT, default_reads
from plait.ir.types import FLOAT_DTYPES, TensorType

# NOTE: operands an op reads but does not promote (``where``'s condition stays bool)
_UNPROMOTED = {"cond"}


class CaptureBuilder(GraphBuilder):
    """A :class:`GraphBuilder` whose calls compute in ``default`` where eager's would take the
    default float dtype (the default in force when it was made, unless given)."""

    def __init__(self, default: torch.dtype | None = None) -> None:
        super().__init__()
        self.default = torch.get_default_dtype() if default is None else default

    def call(
        self,
        op: str,
        *inputs: Any,
        names: Sequence[str] | None = None,
        **attrs: Any,
    ) -> Any:
        if self.default != IR_DEFAULT_FLOAT:
            opdef = get_op(op)
            if _reads_default(opdef, inputs, attrs):
                inputs = tuple(self._cast(opdef, inputs))
                if _reads_default(opdef, inputs, attrs):
                    raise TypeRuleError(
                        f"{op}: computes in the default float dtype ({self.default}) with no "
                        "operand plait can cast to it"
                    )
        return super().call(op, *inputs, names=names, **attrs)

    def _cast(self, opdef: OpDef, inputs: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for i, x in enumerate(inputs):
            name = opdef.params[i].name if i < len(opdef.params) else ""
            if name in _UNPROMOTED:
                out.append(x)
            elif isinstance(x, (list, tuple)):
                out.append([self._cast_one(v) for v in x])
            else:
                out.append(self._cast_one(x))
        return out

    def _cast_one(self, x: Any) -> Any:
        if not isinstance(x, Value) or not isinstance(x.type, TensorType):
            return x
        dtype = x.type.dtype
        if dtype in FLOAT_DTYPES or dtype.is_complex:
            return x
        return super().call("to_dtype", x, dtype=self.default)


def capture_builder() -> GraphBuilder:
    """The builder of a capture under the default in force: a plain :class:`GraphBuilder`
    under float32 (the IR's own default: nothing to cast), else a :class:`CaptureBuilder`."""
    default = torch.get_default_dtype()
    return GraphBuilder() if default == IR_DEFAULT_FLOAT else CaptureBuilder(default)


def _reads_default(opdef: OpDef, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> bool:
    """Whether ``opdef``'s type rule takes the default float dtype for these operands (a call
    the rule rejects reads nothing: the builder's own call raises its error)."""
    with default_reads() as reads:
        try:
            opdef.infer(inputs, attrs)
        except Exception:
            return False
    return bool(reads)

"""The SSA atoms of a graph: values, nodes and their operands (plain data).

An operand of a node is a :class:`Value` or a literal (``int``, ``float``, ``bool``, ``None``, or
a sympy expression for a symbolic ``int``). Each node has one or more output values. The op
registry, the printer and :class:`plait.ir.graph.Graph` build on these.

Example:
    >>> import torch
    >>> from plait.ir.types import TensorType
    >>> x = Value("x", TensorType((2,), torch.float32), kind="user")
    >>> n = Node(0, "relu", (x,), {})
    >>> n.outputs = (Value("0", x.type, n, 0),)
    >>> n, [v.name for v in n.input_values()]
    (<node 0: %0 = relu>, ['x'])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

import sympy

from plait.ir.types import Type

INPUT_KINDS = ("user", "param", "buffer", "const")


@dataclass(eq=False, repr=False)
class Value:
    """An SSA value: a graph input (``kind`` set) or the ``index``-th output of ``producer``."""

    name: str
    type: Type
    producer: Node | None = None
    index: int = 0
    kind: str | None = None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


LiteralValue: TypeAlias = int | float | bool | sympy.Expr | None
Operand: TypeAlias = Value | LiteralValue
AttrValue = (
    Any  # int | float | bool | str | None | torch.dtype | sympy.Expr | tuple[AttrValue, ...]
)


@dataclass(eq=False, repr=False)
class Node:
    """One op applied to ``inputs`` with ``attrs``, defining ``outputs`` (its values)."""

    id: int
    op: str
    inputs: tuple[Operand, ...]
    attrs: dict[str, AttrValue]
    outputs: tuple[Value, ...] = ()

    def input_values(self) -> Iterator[Value]:
        """The operands that are values (literals left out), in operand order."""
        for operand in self.inputs:
            if isinstance(operand, Value):
                yield operand

    def __repr__(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        return f"<node {self.id}: {outs} = {self.op}>"

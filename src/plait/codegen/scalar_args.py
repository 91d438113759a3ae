"""What every scalar rule works with: its operands (:class:`Arg`), their conversion to a compute
type, the output's compute and storage types, and the registration of rules by op name.

Example:
    >>> import torch
    >>> from plait.codegen.kir import KernelBuilder
    >>> b = KernelBuilder("k", outer=())
    >>> a = arg_of(2.5, None)
    >>> a.literal, to(b, a, "f32").op, to(b, a, "i64").op
    (2.5, 'const', 'cast')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from plait.codegen.index import Ix
from plait.codegen.kir import STORAGE_OF, KernelBuilder, Stmt, is_float, scalar_of
from plait.ir.graph import Node, Value
from plait.ir.types import ScalarType, TensorType, scalar_type_of
from plait.symbolic.poly import from_dim


@dataclass(frozen=True)
class Arg:
    """One operand of a pointwise node: a loaded statement, or a Python literal (``stmt`` None)."""

    stmt: Stmt | None
    literal: Any
    type: TensorType | ScalarType | None


# NOTE: a scalar rule: the builder, the node, its operands, the kernel's index at this element
Rule = Callable[[KernelBuilder, Node, Sequence[Arg], tuple[Ix, ...]], Stmt]


def rules_into(table: dict[str, Rule]) -> Callable[..., Callable[[Rule], Rule]]:
    """A decorator registering a rule in ``table`` under each of the op names it is given."""

    def rule(*names: str) -> Callable[[Rule], Rule]:
        def deco(fn: Rule) -> Rule:
            for n in names:
                table[n] = fn
            return fn

        return deco

    return rule


def arg_of(operand: Any, stmt: Stmt | None) -> Arg:
    """The operand of a node as a rule receives it (``stmt``: its loaded value, if a tensor)."""
    if isinstance(operand, Value):
        assert isinstance(operand.type, TensorType)
        return Arg(stmt, None, operand.type)
    if operand is None:
        return Arg(None, None, None)
    return Arg(None, operand, scalar_type_of(operand))


def to(b: KernelBuilder, a: Arg, t: str) -> Stmt:
    """The operand converted to scalar type ``t``."""
    if a.stmt is not None:
        return cast(b, a.stmt, t)
    value = a.literal
    if isinstance(value, sympy.Expr):
        # NOTE: a size expression (a symbolic dim used as a scalar): the kernel computes it from
        # its size arguments, as it computes its loop extents
        return cast(b, b.index(Ix.lit(from_dim(value))), t)
    if t == "b":
        return b.const(bool(value), "b")
    if is_float(t):
        return b.const(value, t)  # NOTE: an int rounds once, to t (const's conversion)
    if isinstance(value, float):
        return cast(b, b.const(value, "f64"), t)
    return b.const(int(value), t)


def narrow(b: KernelBuilder, a: Arg, dtype: torch.dtype) -> Stmt:
    """The operand as eager's kernel reads it when the op's common dtype is ``dtype``.

    PyTorch's TensorIterator casts each operand to the common dtype: for a 16-bit float, an
    operand of another dtype (a Python number, a 0-dim tensor, an integer tensor) is rounded to
    16 bits (``bf16 + 1.3`` adds 1.296875), then computed in float32. Other dtypes: :func:`to`.
    """
    t, storage = scalar_of(dtype), STORAGE_OF[dtype]
    if storage not in ("bf16", "f16") or (isinstance(a.type, TensorType) and a.type.dtype == dtype):
        return to(b, a, t)
    if a.stmt is None and isinstance(a.literal, (bool, int, float)):
        # NOTE: eager's own conversion of the wrapped number (a double or int64 0-dim tensor)
        wide = torch.float64 if isinstance(a.literal, float) else None
        return b.const(float(torch.tensor(a.literal, dtype=wide).to(dtype)), t)
    return b.round(to(b, a, t), storage)


def one_element(a: Arg) -> bool:
    """Whether the operand is a Python number or a tensor of one element (ATen's ``is_scalar``:
    ``mul`` and ``div`` read such a second operand at float precision, never rounded)."""
    if a.stmt is None:
        return True
    return isinstance(a.type, TensorType) and all(d == 1 for d in a.type.shape)


def cast(b: KernelBuilder, x: Stmt, t: str) -> Stmt:
    """``x`` converted to scalar type ``t``."""
    return b.cast(x, t)


def out_type(node: Node) -> str:
    """The compute type of the node's (first) output."""
    t = node.outputs[0].type
    assert isinstance(t, TensorType)
    return scalar_of(t.dtype)


def unary_float(b: KernelBuilder, node: Node, args: Sequence[Arg]) -> tuple[Stmt, str]:
    """The single operand in the node's output compute type, and that type."""
    t = out_type(node)
    return to(b, args[0], t), t


def storage_type(node: Node) -> str:
    """The storage type of the node's output (16-bit floats: ``bf16``/``f16``)."""
    t = node.outputs[0].type
    assert isinstance(t, TensorType)
    return STORAGE_OF[t.dtype]

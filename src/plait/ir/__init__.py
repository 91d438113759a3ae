"""plait's graph IR (L2 core): types, SSA graphs, the op registry, text, verifier, identity,
and the reference interpreter.

Example:
    >>> import torch
    >>> from plait import ir
    >>> b = ir.GraphBuilder()
    >>> x = b.input("x", ir.TensorType((2, 2), torch.float32))
    >>> b.output(b.call("relu", x))
    >>> g = b.build()
    >>> ir.from_text(ir.to_text(g)) is not g
    True
"""

from plait.ir import ops
from plait.ir.builder import GraphBuilder
from plait.ir.graph import INPUT_KINDS, Graph, Node, Operand, Value
from plait.ir.identity import canonical_order, canonical_text, semantic_hash, weights_hash
from plait.ir.interpret import InterpretError, interpret
from plait.ir.ops import (
    Category,
    OpDef,
    TypeRuleError,
    all_ops,
    catalog,  # noqa: F401  (every op family registers its ops)
    get_op,
)
from plait.ir.parser import IRParseError, from_text, parse_type
from plait.ir.text import to_text
from plait.ir.types import NoneType, ScalarType, TensorType, Type
from plait.ir.verify import VerificationError, verify

__all__ = [
    "INPUT_KINDS",
    "Category",
    "Graph",
    "GraphBuilder",
    "IRParseError",
    "InterpretError",
    "Node",
    "NoneType",
    "OpDef",
    "Operand",
    "ScalarType",
    "TensorType",
    "Type",
    "TypeRuleError",
    "Value",
    "VerificationError",
    "all_ops",
    "canonical_order",
    "canonical_text",
    "from_text",
    "get_op",
    "interpret",
    "ops",
    "parse_type",
    "semantic_hash",
    "to_text",
    "verify",
    "weights_hash",
]

"""The closed op registry and its op families.

Importing this package gives the registry (:mod:`plait.ir.ops.registry`); the op families
register their ops when :mod:`plait.ir.ops.catalog` is imported, which :mod:`plait.ir` does
first, so every op is registered before any code outside the IR runs.

Example:
    >>> from plait.ir.ops import all_ops, get_op
    >>> get_op("relu").category.value
    'pointwise'
    >>> "conv2d" in all_ops()
    True
"""

from plait.ir.ops.registry import (
    ATTR_KINDS,
    OPTIONAL_TENSOR,
    SCALAR_OR_TENSOR,
    TENSOR,
    VARIADIC,
    Attr,
    AttrError,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    all_ops,
    get_op,
)

__all__ = [
    "ATTR_KINDS",
    "OPTIONAL_TENSOR",
    "SCALAR_OR_TENSOR",
    "TENSOR",
    "VARIADIC",
    "Attr",
    "AttrError",
    "Category",
    "OpDef",
    "Param",
    "TypeRuleError",
    "all_ops",
    "get_op",
]

"""The closed op registry and its op families.

Example:
    >>> from plait.ir.ops import all_ops, get_op
    >>> get_op("relu").category.value
    'pointwise'
    >>> "conv2d" in all_ops()
    True
"""

from plait.ir.ops import (  # noqa: F401  (registers)
    aten,
    datadep,
    extern,
    movement,
    pointwise,
    reduction,
    rng,
    view,
    vjp,
)
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

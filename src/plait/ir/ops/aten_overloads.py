"""ATen overloads by name: the only way an IR node reaches ``torch.ops.aten``."""

from __future__ import annotations

import re

import torch

from plait.ir.ops.registry import TypeRuleError

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def lookup_overload(name: str, overload: str) -> torch._ops.OpOverload:
    """``torch.ops.aten.<name>.<overload>``, any ATen overload (checked names only)."""
    what = f"aten.{name}.{overload}"
    if not _IDENT.fullmatch(name) or not _IDENT.fullmatch(overload):
        raise TypeRuleError(f"aten: {what!r} is not an ATen overload name")
    try:
        op = getattr(getattr(torch.ops.aten, name), overload)
    except (AttributeError, RuntimeError):
        raise TypeRuleError(f"aten: torch.ops has no overload {what}") from None
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        raise TypeRuleError(f"aten: {what} is not an ATen operator overload")
    return op


def resolve_overload(name: str, overload: str) -> torch._ops.OpOverload:
    """``torch.ops.aten.<name>.<overload>``, a functional overload (random ones included:
    :func:`is_seeded`); nothing outside ``torch.ops.aten`` is ever resolved.

    Example:
        >>> resolve_overload("acos", "default")
        <OpOverload(op='aten.acos', overload='default')>
    """
    op = lookup_overload(name, overload)
    schema = op._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        raise TypeRuleError(
            f"aten: aten.{name}.{overload} writes or aliases its arguments; the IR is functional"
        )
    if not schema.returns:
        raise TypeRuleError(
            f"aten: aten.{name}.{overload} returns nothing; a runtime check is an aten_check node"
        )
    return op

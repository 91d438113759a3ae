"""Extern ops PyTorch runs: dropout, constants (full, zeros, ones, arange) and opaque calls."""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from plait.ir.graph import Operand
from plait.ir.ops.call_autograd import call_probe, differentiated_call
from plait.ir.ops.call_literals import call_spec, count_operands, resolve_target, run_call
from plait.ir.ops.registry import (
    VARIADIC,
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import require_float
from plait.ir.ops.vjp import NoDerivativeError, VjpContext, nondifferentiable, vjp
from plait.ir.parser import parse_type
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, Type
from plait.symbolic import normalize

FLOATS = FLOAT_DTYPES
ALL = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)


# --- random --------------------------------------------------------------------------------
def _dropout_rule(x: TensorType, p: float, train: bool) -> list[Type]:
    require_float(x, "dropout")
    if not 0.0 <= p <= 1.0:
        raise TypeRuleError(f"dropout: p must be in [0, 1], got {p}")
    return [x]


register(
    OpDef(
        "dropout",
        Category.RANDOM,
        (Param("x"),),
        (Attr("p", "float", 0.5), Attr("train", "bool", True)),
        _dropout_rule,
        lambda x, p, train: F.dropout(x, p, train),
        FLOATS,
        "identity when train is false",
        random_when=lambda a: a["train"] and a["p"] > 0,
    )
)


# --- constants -----------------------------------------------------------------------------
def _full_rule(shape: tuple, dtype: torch.dtype, device: str, **_: Any) -> list[Type]:
    if any(isinstance(d, int) and d < 0 for d in shape):
        raise TypeRuleError(f"negative dim in shape {list(shape)}")
    return [TensorType(tuple(shape), dtype, device)]


_CONST_ATTRS = (Attr("shape", "dims"), Attr("dtype", "dtype"), Attr("device", "str", "cpu"))
register(
    OpDef(
        "full",
        Category.CONSTANT,
        (),
        (*_CONST_ATTRS, Attr("value", "scalar")),
        _full_rule,
        lambda shape, dtype, device, value: torch.full(shape, value, dtype=dtype, device=device),
        ALL,
    )
)
register(
    OpDef(
        "zeros",
        Category.CONSTANT,
        (),
        _CONST_ATTRS,
        _full_rule,
        lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device),
        ALL,
    )
)
register(
    OpDef(
        "ones",
        Category.CONSTANT,
        (),
        _CONST_ATTRS,
        _full_rule,
        lambda shape, dtype, device: torch.ones(shape, dtype=dtype, device=device),
        ALL,
    )
)


def arange_length(start: float, end: float, step: float) -> int:
    """PyTorch's arange element count: ceil((end - start) / step), never negative."""

    if step == 0:
        raise TypeRuleError("arange: step must be nonzero")
    return max(0, math.ceil((end - start) / step))


def _arange_rule(start: Any, end: Any, step: Any, dtype: torch.dtype, device: str) -> list[Type]:
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        return [TensorType((arange_length(start, end, step),), dtype, device)]
    # NOTE: symbolic bounds are size expressions; with integer start and step the length is
    # exact integer arithmetic, never a float ceil.
    if not (isinstance(start, int) and isinstance(step, int)) or step <= 0:
        raise TypeRuleError(
            "arange: a symbolic end needs an integer start and a positive "
            "integer step; specialize the bounds"
        )
    if isinstance(end, float):
        raise TypeRuleError("arange: a float end with a symbolic start; specialize them")
    length = normalize(sympy.Max(0, sympy.ceiling((end - start) / sympy.Integer(step))))
    return [TensorType((length,), dtype, device)]


register(
    OpDef(
        "arange",
        Category.CONSTANT,
        (),
        (
            Attr("start", "scalar", 0),
            Attr("end", "scalar"),
            Attr("step", "scalar", 1),
            Attr("dtype", "dtype"),
            Attr("device", "str", "cpu"),
        ),
        _arange_rule,
        lambda start, end, step, dtype, device: torch.arange(
            start, end, step, dtype=dtype, device=device
        ),
        (*FLOATS, *INT_DTYPES),
    )
)


def _opaque_rule(
    *args: Any, target: str, out_types: str, literals: str, kwliterals: str
) -> list[Type]:
    resolve_target(target)
    positional, keywords = call_spec(literals, kwliterals)
    if positional is not None or keywords:
        # NOTE: without ``literals`` the operands are the positional arguments, all of them
        used = len(args[0]) if positional is None else count_operands(positional)
        used += count_operands(keywords)
        if used != len(args[0]):
            raise TypeRuleError(
                f"opaque: the call spec uses {used} tensor operand(s), the node has {len(args[0])}"
            )
    types = [parse_type(s.strip()) for s in out_types.split(";") if s.strip()]
    if not types:
        raise TypeRuleError("opaque: out_types must name at least one output type")
    return types


def _opaque_ref(
    args: list[Any], target: str, out_types: str, literals: str, kwliterals: str
) -> Any:
    return run_call(list(args), target, literals, kwliterals)


register(
    OpDef(
        "opaque",
        Category.OPAQUE,
        (Param("args", VARIADIC),),
        (
            Attr("target", "str"),
            Attr("out_types", "str"),
            Attr("literals", "str", ""),
            Attr("kwliterals", "str", ""),
        ),
        _opaque_rule,
        _opaque_ref,
        ALL,
        "a PyTorch call with no IR op; run by PyTorch and counted as a fallback",
        fixed_outputs=None,
    )
)


@vjp("dropout")
def _dropout_vjp(ctx: VjpContext) -> list[Operand | None]:
    """Eval mode and p=0 are the identity, and p=1 multiplies by zero (eager draws nothing for
    either). Train mode's gradient for 0 < p < 1 is the mask it drew, which the node does not
    return: the joint graph first rewrites it into ``aten native_dropout`` (its mask an output;
    the same draws as F.dropout), whose rule reads the mask."""
    p, train = ctx.attrs["p"], ctx.attrs["train"]
    if not ctx.wants(0):
        return [None]
    if not train or p == 0:
        return [ctx.grad()]
    if p == 1:
        return [ctx.call("mul", ctx.grad(), 0.0)]  # NOTE: eager's x * zeros: NaN stays NaN
    raise NoDerivativeError(
        f"dropout in train mode (p={p}): its gradient needs the mask it drew; the joint graph "
        "must first rewrite it into aten native_dropout "
        "(plait.autograd.joint.prepare_for_autograd)"
    )


nondifferentiable("full", "zeros", "ones", "arange")


@vjp("opaque")
def _opaque_vjp(ctx: VjpContext) -> list[Operand | None]:
    """PyTorch's autograd over the call (it runs the call again in the backward). NOTE: capture
    makes a call that moved the generator a ``random_call``; an opaque node whose call draws
    (a hand-written one) is refused: running it again would draw other numbers."""
    target = ctx.attrs["target"]
    probe = call_probe(ctx, target)
    if probe is not None and probe.draws:
        raise NoDerivativeError(
            f"opaque {target} draws random numbers ({', '.join(probe.draws)}): its gradient "
            "would run it again and draw others"
        )
    return differentiated_call(ctx, probe)

"""Training-mode batch norm fused with the ReLU after it, forward and backward: what the
``fuse-bn-relu`` pass (:mod:`plait.passes.fuse_bn_relu`) makes of a Triton program's ATen batch
norm and the ReLU that alone reads its result, and of the batch-norm backward and the ReLU
mask of its output gradient. Both run as ATen's calls (the ``aten`` node's attributes name
the overload and its arguments) with the ReLU inside:

- ``batch_norm_relu(args...)``: ``_native_batch_norm_legit_functional`` (or
  ``_native_batch_norm_legit.no_stats``) with ``relu`` applied to its normalized result
  (result 0); its other results (batch mean, inverse standard deviation, running statistics)
  are ATen's.
- ``batch_norm_relu_backward(args..., y)``: ``native_batch_norm_backward`` whose output
  gradient is first masked by ``y``, the ReLU's result (the last operand, of the gradient's
  type): ``where(le(y, 0), 0.0, grad_out)``, the ReLU's derivative rule (eager's
  ``threshold_backward``: a NaN in ``y`` passes the gradient).

Each reference composes the ops it replaces, so a graph rewritten into these ops computes the
same bits under the reference interpreter.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 3, 5), torch.float32))
    >>> y, mean, rstd = gb.call("batch_norm_relu", [x], name="_native_batch_norm_legit",
    ...                         overload="no_stats",
    ...                         literals='[{"t": 0}, null, null, true, 0.1, 1e-05]')
    >>> str(y.type), str(mean.type)
    ('f32[4, 3, 5]', 'f32[3]')
"""

from __future__ import annotations

from typing import Any

import torch

from plait.ir.ops.aten import ATEN_ATTRS
from plait.ir.ops.aten_derivatives import batch_norm_backward
from plait.ir.ops.aten_overloads import resolve_overload
from plait.ir.ops.call_literals import decode_call
from plait.ir.ops.registry import (
    VARIADIC,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    get_op,
    register,
)
from plait.ir.ops.vjp import (
    NoDerivativeError,
    VjpContext,
    torch_vjp_rule,
    vjp,
)
from plait.ir.ssa import Operand
from plait.ir.types import FLOAT_DTYPES, TensorType, Type

FORWARD = frozenset(
    {("_native_batch_norm_legit_functional", "default"), ("_native_batch_norm_legit", "no_stats")}
)
BACKWARD = ("native_batch_norm_backward", "default")


def bound_slots(name: str, overload: str, literals: str, kwliterals: str, operands: int) -> Any:
    """The overload's arguments by schema name, a tensor operand as its index (an ``int``)."""
    args, keywords = decode_call(list(range(operands)), literals, kwliterals)
    schema = resolve_overload(name, overload)._schema
    bound = {arg.name: v for arg, v in zip(schema.arguments, args)}
    bound.update(keywords)
    return bound


def grad_slot(literals: str, kwliterals: str, operands: int) -> int:
    """The operand index of ``native_batch_norm_backward``'s ``grad_out``."""
    i = bound_slots(*BACKWARD, literals, kwliterals, operands).get("grad_out")
    if not isinstance(i, int) or isinstance(i, bool):
        raise TypeRuleError("batch_norm_relu_backward: grad_out is no tensor operand")
    return i


def _named(op: str, name: str, overload: str, allowed: Any) -> None:
    if (name, overload) not in allowed:
        raise TypeRuleError(f"{op}: aten.{name}.{overload} is not the batch norm it fuses")


def _forward_rule(
    args: list[Type], name: str, overload: str, literals: str, kwliterals: str
) -> list[Type]:
    _named("batch_norm_relu", name, overload, FORWARD)
    return list(get_op("aten").type_rule(args, name, overload, literals, kwliterals))


def _backward_rule(
    args: list[Type], name: str, overload: str, literals: str, kwliterals: str
) -> list[Type]:
    _named("batch_norm_relu_backward", name, overload, {BACKWARD})
    if len(args) < 2:
        raise TypeRuleError("batch_norm_relu_backward: takes the backward's operands, then y")
    *operands, y = args
    g = operands[grad_slot(literals, kwliterals, len(operands))]
    if not isinstance(y, TensorType) or y != g:
        raise TypeRuleError(
            f"batch_norm_relu_backward: the ReLU's result y is {y}, the gradient {g}: one type"
        )
    return list(get_op("aten").type_rule(operands, name, overload, literals, kwliterals))


def _forward_ref(args: list[Any], name: str, overload: str, literals: str, kwliterals: str) -> Any:
    out = get_op("aten").reference(args, name, overload, literals, kwliterals)
    return (torch.relu(out[0]), *out[1:])


def _backward_ref(args: list[Any], name: str, overload: str, literals: str, kwliterals: str) -> Any:
    *operands, y = args
    i = grad_slot(literals, kwliterals, len(operands))
    operands[i] = torch.where(torch.le(y, 0), 0.0, operands[i])
    return get_op("aten").reference(operands, name, overload, literals, kwliterals)


register(
    OpDef(
        "batch_norm_relu",
        Category.EXTERN,
        (Param("args", VARIADIC),),
        ATEN_ATTRS,
        _forward_rule,
        _forward_ref,
        FLOAT_DTYPES,
        "ATen's functional training batch norm, relu applied to its normalized result",
        fixed_outputs=None,
    )
)
register(
    OpDef(
        "batch_norm_relu_backward",
        Category.EXTERN,
        (Param("args", VARIADIC),),
        ATEN_ATTRS,
        _backward_rule,
        _backward_ref,
        FLOAT_DTYPES,
        "native_batch_norm_backward of the output gradient masked by the ReLU's result y "
        "(the last operand): where(le(y, 0), 0.0, grad_out)",
        fixed_outputs=None,
    )
)


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------


@vjp("batch_norm_relu")
def _batch_norm_relu_vjp(ctx: VjpContext) -> list[Operand | None]:
    """``batch_norm_relu_backward``: the batch-norm backward of the cotangent masked by the
    ReLU's result (output 0), reading the batch statistics the forward returned (outputs 1 and
    2), as the unfused rules (the relu's, ATen's batch norm's) compute it. Running statistics
    get no gradient."""
    a = ctx.attrs
    bound = bound_slots(a["name"], a["overload"], a["literals"], a["kwliterals"], len(ctx.inputs))
    return batch_norm_backward(ctx, bound, "batch_norm_relu_backward", last=ctx.outputs[0])


@vjp("batch_norm_relu_backward")
def _batch_norm_relu_backward_vjp(ctx: VjpContext) -> list[Operand | None]:
    """PyTorch's autograd over the reference (``torch_vjp``), which has no derivative with
    respect to the saved batch statistics: refused where one is wanted."""
    a = ctx.attrs
    bound = bound_slots(*BACKWARD, a["literals"], a["kwliterals"], len(ctx.inputs) - 1)
    for name in ("save_mean", "save_invstd"):
        i = bound.get(name)
        if isinstance(i, int) and ctx.wants(i):
            raise NoDerivativeError(
                f"batch_norm_relu_backward: no derivative with respect to {name} (PyTorch's "
                "batch-norm backward has none)"
            )
    return torch_vjp_rule(ctx)

"""Derivative rules of the ATen extern nodes (:mod:`plait.ir.ops.aten`): PyTorch's autograd over
the overload by default (``torch_vjp``), and rules of their own for the calls whose saved values
or random draws need them (dropout, CPU flash attention, max pooling with indices, training batch
norm, EmbeddingBag).

Example:
    >>> from plait.ir.ops.vjp import has_rule, is_differentiable
    >>> has_rule("aten"), is_differentiable("aten_factory")
    (True, False)
"""

from __future__ import annotations

import json
from typing import Any

import torch

from plait.ir.graph import Operand, Value
from plait.ir.ops.aten import is_seeded
from plait.ir.ops.aten_overloads import resolve_overload
from plait.ir.ops.call_autograd import ZERO_GRADIENT_DRAWS, call_probe, differentiated_call
from plait.ir.ops.call_literals import decode_call
from plait.ir.ops.pointwise_grads import zero_grads
from plait.ir.ops.pooling import max_pool_backward
from plait.ir.ops.vjp import (
    NoDerivativeError,
    VjpContext,
    empty_batch_zeros,
    is_empty,
    nondifferentiable,
    torch_vjp_rule,
    vjp,
)

aten = torch.ops.aten


@vjp("aten")
def _aten_vjp(ctx: VjpContext) -> list[Operand | None]:
    """PyTorch's autograd over the overload (``torch_vjp``: it runs the overload again in the
    backward), except where running it again would draw other random numbers: ``native_dropout``
    reads the mask it returned; a draw whose eager derivative is zero has a zero one; any other
    random call is refused."""
    name, overload = ctx.attrs["name"], ctx.attrs["overload"]
    op = resolve_overload(name, overload)
    if op is aten.native_dropout.default:
        return _native_dropout_vjp(ctx)
    if op is aten._scaled_dot_product_flash_attention_for_cpu.default:
        return _cpu_flash_attention_vjp(ctx)
    if op is aten.max_pool2d_with_indices.default:
        return _max_pool_with_indices_vjp(ctx, op)
    if op in (aten._embedding_bag_forward_only.default, aten._embedding_bag.default):
        return _embedding_bag_vjp(ctx)
    if op in (
        aten._native_batch_norm_legit_functional.default,
        aten._native_batch_norm_legit.no_stats,
    ):
        return _batch_norm_train_vjp(ctx, op)
    if str(op) in ZERO_GRADIENT_DRAWS:
        return zero_grads(ctx)  # NOTE: zeros, as eager's: an optimizer steps on them (not None)
    probe = call_probe(ctx, f"aten.{name}.{overload}")
    if (probe is None and is_seeded(op)) or (probe is not None and probe.draws):
        raise NoDerivativeError(
            f"aten.{name}.{overload} draws random numbers: its gradient would run it again and "
            "draw others (plait differentiates native_dropout through its mask, and the draws "
            "whose eager gradient is zero)"
        )
    return differentiated_call(ctx, probe)


def _embedding_bag_vjp(ctx: VjpContext) -> list[Operand | None]:
    """PyTorch's autograd over ``_embedding_bag`` (``torch_vjp``: it runs the bags again in the
    backward), seeded with the bags' cotangent alone: ``EmbeddingBagBackward0`` gives the weight's
    and the per-sample weights' gradients; offset2bag, bag_size and max_indices are integers and
    take none. Capture traces ``F.embedding_bag`` with a weight that does not require grad, so
    it records ``_embedding_bag_forward_only``, which has no derivative (autograd refuses its
    integer results); the gradient is that of ``_embedding_bag``, which eager calls when one
    flows: the same arguments and first result. ``sparse=True`` asks for a sparse weight
    gradient, which a compiled backward does not return: refused."""
    op = aten._embedding_bag.default
    slots = list(range(len(ctx.inputs)))
    args, keywords = decode_call(slots, ctx.attrs["literals"], ctx.attrs["kwliterals"])
    bound = {a.name: v for a, v in zip(op._schema.arguments, args)}
    bound.update(keywords)
    if bound.get("sparse"):
        raise NoDerivativeError(
            f"aten.{ctx.attrs['name']} with sparse=True: eager gives the weight a sparse "
            "gradient, and a compiled backward returns dense ones"
        )
    bags_only = [ctx.grads[0], *([None] * (len(ctx.grads) - 1))]
    train = VjpContext(ctx.builder, ctx.node, bags_only, ctx.needs)
    train.attrs = {**ctx.attrs, "name": "_embedding_bag"}
    return torch_vjp_rule(train)


def _batch_norm_train_vjp(ctx: VjpContext, op: Any) -> list[Operand | None]:
    """``native_batch_norm_backward``: eager's backward kernel, bitwise (see
    :func:`batch_norm_backward`)."""
    slots = list(range(len(ctx.inputs)))
    args, keywords = decode_call(slots, ctx.attrs["literals"], ctx.attrs["kwliterals"])
    bound = {a.name: v for a, v in zip(op._schema.arguments, args)}
    bound.update(keywords)
    return batch_norm_backward(ctx, bound, "aten")


def batch_norm_backward(
    ctx: VjpContext, bound: dict[str, Any], op: str, last: Operand | None = None
) -> list[Operand | None]:
    """The input, weight and bias gradients of a training batch norm (``bound``: its arguments
    by schema name, a tensor as its operand index) as one node ``op`` calling
    ``native_batch_norm_backward``, which reads the batch mean and inverse standard deviation
    the forward returned (outputs 1 and 2); ``last``: an operand after those the call reads
    (``batch_norm_relu_backward``'s ReLU result). Running statistics get no gradient, and the
    backward never reads them (in training mode the kernel reads the saved batch statistics;
    the buffers are written after the call)."""
    x, w, b = bound["input"], bound.get("weight"), bound.get("bias")
    mask = [ctx.wants(x), w is not None and ctx.wants(w), b is not None and ctx.wants(b)]
    out: list[Operand | None] = [None] * len(ctx.inputs)
    if not any(mask):
        return out
    if is_empty(ctx.inputs[x]):
        return empty_batch_zeros(ctx, [i for ok, i in zip(mask, (x, w, b)) if ok])
    tensors: list[Operand] = []

    def ref(v: Operand | None) -> Any:
        if v is None:
            return None
        tensors.append(v)
        return {"t": len(tensors) - 1}

    weight = None if w is None else ctx.inputs[w]
    literals = [
        ref(ctx.grad(0)), ref(ctx.inputs[x]), ref(weight), None, None,
        ref(ctx.outputs[1]), ref(ctx.outputs[2]), True, float(bound["eps"]), mask,
    ]  # fmt: skip
    if last is not None:
        tensors.append(last)
    found = ctx.call(
        op,
        tensors,
        name="native_batch_norm_backward",
        overload="default",
        literals=json.dumps(literals),
    )
    found = iter(found if isinstance(found, tuple) else (found,))
    for wanted, i in zip(mask, (x, w, b)):
        if wanted:
            out[i] = next(found)
    return out


def _max_pool_with_indices_vjp(ctx: VjpContext, op: Any) -> list[Operand | None]:
    """The cotangent routed to the maxima the forward found (its indices output): eager's
    backward kernel, and the forward never runs again."""
    if not ctx.wants(0):
        return [None] * len(ctx.inputs)
    args, keywords = decode_call([0], ctx.attrs["literals"], ctx.attrs["kwliterals"])
    bound = {a.name: v for a, v in zip(op._schema.arguments, args)}
    bound.update(keywords)
    attrs = {
        "kernel_size": tuple(bound["kernel_size"]),
        "stride": tuple(bound.get("stride") or ()),
        "padding": tuple(bound.get("padding", (0, 0))),
        "dilation": tuple(bound.get("dilation", (1, 1))),
        "ceil_mode": bool(bound.get("ceil_mode", False)),
    }
    x = ctx.inputs[0]
    assert isinstance(x, Value)
    (gx,) = max_pool_backward(ctx, ctx.grad(0), x, ctx.outputs[1], attrs)
    return [gx]


def _cpu_flash_attention_vjp(ctx: VjpContext) -> list[Operand | None]:
    """``_scaled_dot_product_flash_attention_for_cpu_backward`` reading the forward's output
    and log-sum-exp: eager's backward kernel, bitwise. The mask (operand 3) gets no gradient: the
    autograd layer makes this node only where none flows into it."""
    slots = list(range(len(ctx.inputs)))
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    args, keywords = decode_call(slots, ctx.attrs["literals"], ctx.attrs["kwliterals"])
    bound = {a.name: v for a, v in zip(op._schema.arguments, args)}
    bound.update(keywords)
    if not any(ctx.wants(i) for i in range(3)):
        return [None] * len(ctx.inputs)
    tensors: list[Value] = []
    mask = bound.get("attn_mask")
    literals = [
        _tensor_ref(tensors, ctx.grad(0)),
        *(_input_ref(ctx, tensors, bound[name]) for name in ("query", "key", "value")),
        _tensor_ref(tensors, ctx.outputs[0]),
        _tensor_ref(tensors, ctx.outputs[1]),
        float(bound.get("dropout_p", 0.0)),
        bool(bound.get("is_causal", False)),
    ]
    kw = {
        "attn_mask": None if mask is None else _input_ref(ctx, tensors, mask),
        "scale": bound.get("scale"),
    }
    gq, gk, gv = ctx.call(
        "aten",
        tensors,
        name="_scaled_dot_product_flash_attention_for_cpu_backward",
        overload="default",
        literals=json.dumps(literals),
        kwliterals=json.dumps(kw),
    )
    out: list[Operand | None] = [None] * len(ctx.inputs)
    for i, g in zip((bound["query"], bound["key"], bound["value"]), (gq, gk, gv)):
        if ctx.wants(i):
            out[i] = g
    return out


def _input_ref(ctx: VjpContext, tensors: list[Value], i: int) -> dict[str, int]:
    v = ctx.inputs[i]
    assert isinstance(v, Value)
    return _tensor_ref(tensors, v)


def _tensor_ref(tensors: list[Value], v: Value) -> dict[str, int]:
    tensors.append(v)
    return {"t": len(tensors) - 1}


def _native_dropout_vjp(ctx: VjpContext) -> list[Operand | None]:
    """``native_dropout_backward(grad, mask, scale)`` on the node's mask output. NOTE: eager's
    derivative (derivatives.yaml): scale ``1 / (1 - p)`` in train mode (0 when p = 1), and 1 when
    ``train`` is false or None. With ``train=None`` the kernel drops and scales as in train mode
    but eager's gradient is not scaled: plait matches eager."""
    if not ctx.wants(0):
        return [None] * len(ctx.inputs)
    attrs = ctx.attrs
    slots = [object() for _ in ctx.inputs]
    args, keywords = decode_call(slots, attrs["literals"], attrs["kwliterals"])
    bound = {
        arg.name: value for arg, value in zip(aten.native_dropout.default._schema.arguments, args)
    }
    bound.update(keywords)
    p, train = float(bound["p"]), bound.get("train")
    scale = (0.0 if p == 1 else 1.0 / (1.0 - p)) if train else 1.0
    mask = ctx.outputs[1]
    grad = ctx.call(
        "aten",
        [ctx.grad(0), mask],
        name="native_dropout_backward",
        overload="default",
        literals=json.dumps([{"t": 0}, {"t": 1}, scale]),
    )
    return [grad[0], *([None] * (len(ctx.inputs) - 1))]


nondifferentiable("aten_factory", "aten_check")

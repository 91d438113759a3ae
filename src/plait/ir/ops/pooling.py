"""Pooling ops (max, average, adaptive average) and their derivatives."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plait.ir.graph import Operand, Value
from plait.ir.ops.linalg import conv_out_size
from plait.ir.ops.registry import (
    Attr,
    Category,
    OpDef,
    Param,
    TypeRuleError,
    register,
)
from plait.ir.ops.rules import require_float
from plait.ir.ops.vjp import (
    VjpContext,
    all_static,
    aten_node,
    torch_vjp_rule,
    vjp,
)
from plait.ir.types import FLOAT_DTYPES, TensorType, Type

FLOATS = FLOAT_DTYPES


def _pool_rule(name: str) -> Any:
    def rule(
        x: TensorType,
        kernel_size: tuple,
        stride: tuple | None,
        padding: tuple,
        ceil_mode: bool,
        dilation: tuple = (1, 1),
        **_: Any,
    ) -> list[Type]:
        if x.rank not in (3, 4):
            raise TypeRuleError(f"{name}: expects a 3-D or 4-D input, got {x}")
        stride = stride or kernel_size
        for what, v in (("kernel_size", kernel_size), ("stride", stride), ("padding", padding)):
            if len(v) != 2:
                raise TypeRuleError(f"{name}: {what} takes two values, got {list(v)}")
        if any(2 * p > k for p, k in zip(padding, kernel_size)):
            raise TypeRuleError(f"{name}: padding {list(padding)} exceeds half the kernel")
        hw = tuple(
            conv_out_size(
                x.shape[x.rank - 2 + i],
                kernel_size[i],
                stride[i],
                padding[i],
                dilation[i],
                ceil_mode,
            )
            for i in range(2)
        )
        return [x.with_shape((*x.shape[:-2], *hw))]

    return rule


_POOL_ATTRS = (
    Attr("kernel_size", "ints"),
    Attr("stride", "ints?", None),
    Attr("padding", "ints", (0, 0)),
)
register(
    OpDef(
        "max_pool2d",
        Category.EXTERN,
        (Param("x"),),
        (*_POOL_ATTRS, Attr("dilation", "ints", (1, 1)), Attr("ceil_mode", "bool", False)),
        _pool_rule("max_pool2d"),
        lambda x, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool2d(
            x, kernel_size, stride, padding, dilation, ceil_mode
        ),
        (*FLOATS, torch.int64),
    )
)
register(
    OpDef(
        "avg_pool2d",
        Category.EXTERN,
        (Param("x"),),
        (
            *_POOL_ATTRS,
            Attr("ceil_mode", "bool", False),
            Attr("count_include_pad", "bool", True),
            Attr("divisor_override", "int?", None),
        ),
        _pool_rule("avg_pool2d"),
        lambda x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override: (
            F.avg_pool2d(
                x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
            )
        ),
        FLOATS,
    )
)


def _adaptive_rule(x: TensorType, output_size: tuple) -> list[Type]:
    require_float(x, "adaptive_avg_pool2d")
    if x.rank not in (3, 4) or len(output_size) != 2:
        raise TypeRuleError(f"adaptive_avg_pool2d: expects 3-D/4-D input and two sizes, got {x}")
    return [x.with_shape((*x.shape[:-2], *output_size))]


register(
    OpDef(
        "adaptive_avg_pool2d",
        Category.EXTERN,
        (Param("x"),),
        (Attr("output_size", "ints"),),
        _adaptive_rule,
        lambda x, output_size: F.adaptive_avg_pool2d(x, output_size),
        FLOATS,
    )
)


def _pool_stride(attrs: Any) -> list[int]:
    return list(attrs["stride"] or attrs["kernel_size"])


@vjp("max_pool2d")
def _max_pool2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    assert isinstance(x, Value)
    g = ctx.grad()
    if not all_static(g, x):
        return torch_vjp_rule(ctx)
    a = ctx.attrs
    window = max_pool_window(a)
    # NOTE: the node returns no indices: the rule finds them again (eager's kernel, its ties);
    # the autograd layer makes the node ATen's max_pool2d_with_indices where it can, which keeps
    # them (then this rule is not used)
    _, indices = aten_node(ctx, "max_pool2d_with_indices", [x], [{"t": 0}, *window])
    (gx,) = max_pool_backward(ctx, g, x, indices, a)
    return [gx]


def max_pool_window(attrs: Any) -> list[Any]:
    """The window arguments of ATen's max_pool2d_with_indices for a max_pool2d node's attrs:
    kernel size, stride, padding, dilation, ceil mode."""
    return [
        list(attrs["kernel_size"]),
        _pool_stride(attrs),
        list(attrs["padding"]),
        list(attrs["dilation"]),
        attrs["ceil_mode"],
    ]


def max_pool_backward(
    ctx: VjpContext, g: Value, x: Value, indices: Value, attrs: Any
) -> tuple[Any, ...]:
    """``max_pool2d_with_indices_backward``: the cotangent routed to the maxima the forward
    found (its indices)."""
    literals = [{"t": 0}, {"t": 1}, *max_pool_window(attrs), {"t": 2}]
    return tuple(aten_node(ctx, "max_pool2d_with_indices_backward", [g, x, indices], literals))


@vjp("avg_pool2d")
def _avg_pool2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    assert isinstance(x, Value)
    g = ctx.grad()
    if not all_static(g, x):
        return torch_vjp_rule(ctx)
    a = ctx.attrs
    literals = [
        {"t": 0},
        {"t": 1},
        list(a["kernel_size"]),
        _pool_stride(a),
        list(a["padding"]),
        a["ceil_mode"],
        a["count_include_pad"],
        a["divisor_override"],
    ]
    (gx,) = aten_node(ctx, "avg_pool2d_backward", [g, x], literals)
    return [gx]


@vjp("adaptive_avg_pool2d")
def _adaptive_avg_pool2d_vjp(ctx: VjpContext) -> list[Operand | None]:
    (x,) = ctx.inputs
    assert isinstance(x, Value)
    g = ctx.grad()
    if not all_static(g, x):
        return torch_vjp_rule(ctx)
    if _global_on_cuda(x, ctx.attrs["output_size"]):
        return [_global_average_grad(ctx, g, x)]
    (gx,) = aten_node(ctx, "_adaptive_avg_pool2d_backward", [g, x], [{"t": 0}, {"t": 1}])
    return [gx]


def _global_on_cuda(x: Value, output_size: Any) -> bool:
    t = x.type
    return (
        isinstance(t, TensorType)
        and str(t.device).startswith("cuda")
        and tuple(output_size) == (1, 1)
        and t.dtype in FLOATS
    )


def _global_average_grad(ctx: VjpContext, g: Value, x: Value) -> Value:
    """A global average's gradient on CUDA: each input position gets its cotangent divided by
    the width, then by the height, each quotient rounded to the cotangent's dtype (eager's
    kernel divides so, then adds the share into zeros), broadcast over the window. A broadcast,
    so the planner fuses it into its consumers' Triton kernels: ATen's atomic kernel took 0.74
    ms for ResNet-50's (64, 2048, 7, 7) in bfloat16 on an H200, and read the forward's input."""
    t = x.type
    assert isinstance(t, TensorType)
    share = ctx.call("div", ctx.call("div", g, t.shape[-1]), t.shape[-2])
    out = ctx.call("expand", share, shape=t.shape)
    assert isinstance(out, Value)
    return out

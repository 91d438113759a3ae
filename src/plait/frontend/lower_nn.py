"""Rules for ``torch.nn.functional`` and the extern ops: linear, conv, pooling, normalization,
dropout, attention, embedding.

NOTE: BatchNorm in training mode updates its running statistics in place; the rule maps it to the
functional ``batch_norm_train`` and rebinds ``running_mean``/``running_var`` to its outputs (the
module's separate ``num_batches_tracked.add_(1)`` is an ordinary in-place add).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from plait.frontend.table import InPlace, NoIROp, Viewed, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep
from plait.ir import TensorType, Value

T = torch.Tensor


def _opt(cx: CaptureContext, t: Any) -> Value | None:
    return None if t is None else cx.value(t)


def _pair(cx: CaptureContext, v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return (cx.int(v[0]), cx.int(v[0]))
        return (cx.int(v[0]), cx.int(v[1]))
    return (cx.int(v), cx.int(v))


def _pool_stride(cx: CaptureContext, stride: Any) -> tuple[int, int] | None:
    """A pooling stride: None, or an empty sequence (PyTorch's default), means the kernel size."""
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        return None
    return _pair(cx, stride)


@op(F.linear)
def _linear(cx: CaptureContext, out: Any, x: Any, weight: Any, bias: Any = None) -> Value:
    v: Value = cx.call("linear", cx.value(x), cx.value(weight), _opt(cx, bias))
    return v


@op(torch.addmm)
@op(torch.Tensor.addmm)
def _addmm(
    cx: CaptureContext, out: Any, bias: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1
) -> Value:
    """``bias + mat1 @ mat2`` (Hugging Face's ``Conv1D``) as ``linear(mat1, mat2.T, bias)``: one
    GEMM with the bias fused, as eager's. Scaled forms (beta, alpha other than 1) and a bias that
    is not a row vector have no IR op."""
    if not (_is_one(beta) and _is_one(alpha)):
        raise NoIROp("addmm with beta or alpha other than 1 has no IR op")
    b, w = _tensor_type(cx, bias), _tensor_type(cx, mat2)
    if b.rank != 1 or w.rank != 2 or b.shape[0] != w.shape[1]:
        raise NoIROp("addmm with a bias that is not a vector of the output width has no IR op")
    weight = cx.call("transpose", cx.value(mat2), dim0=0, dim1=1)
    v: Value = cx.call("linear", cx.value(mat1), weight, cx.value(bias))
    return v


def _tensor_type(cx: CaptureContext, t: Any) -> TensorType:
    ty = cx.value(t).type
    if not isinstance(ty, TensorType):
        raise NoIROp(f"expected a tensor operand, got {ty}")
    return ty


def _is_one(x: Any) -> bool:
    return type(x) in (int, float, bool) and x == 1


@op(F.conv2d)
def _conv2d(
    cx: CaptureContext,
    out: Any,
    x: Any,
    weight: Any,
    bias: Any = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: Any = 1,
) -> Value:
    dil = _pair(cx, dilation)
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0, 0)
        else:  # "same": PyTorch pads asymmetrically (an extra F.pad) when the total is odd
            kernel = tuple(int(k) for k in cx.tracer(weight)._plain.shape[2:])
            totals = [d * (k - 1) for d, k in zip(dil, kernel)]
            if any(t % 2 for t in totals):
                raise NoIROp("padding='same' with an even effective kernel pads asymmetrically")
            pad = (totals[0] // 2, totals[1] // 2)
    else:
        pad = _pair(cx, padding)
    v: Value = cx.call(
        "conv2d",
        cx.value(x),
        cx.value(weight),
        _opt(cx, bias),
        stride=_pair(cx, stride),
        padding=pad,
        dilation=dil,
        groups=cx.int(groups),
    )
    return v


@op(F.max_pool2d)
def _max_pool2d(
    cx: CaptureContext,
    out: Any,
    x: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Value:
    if return_indices:
        raise NoIROp("max_pool2d(return_indices=True) has no IR op")
    v: Value = cx.call(
        "max_pool2d",
        cx.value(x),
        kernel_size=_pair(cx, kernel_size),
        stride=_pool_stride(cx, stride),
        padding=_pair(cx, padding),
        dilation=_pair(cx, dilation),
        ceil_mode=bool(ceil_mode),
    )
    return v


@op(F.avg_pool2d)
def _avg_pool2d(
    cx: CaptureContext,
    out: Any,
    x: Any,
    kernel_size: Any,
    stride: Any = None,
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Value:
    v: Value = cx.call(
        "avg_pool2d",
        cx.value(x),
        kernel_size=_pair(cx, kernel_size),
        stride=_pool_stride(cx, stride),
        padding=_pair(cx, padding),
        ceil_mode=bool(ceil_mode),
        count_include_pad=bool(count_include_pad),
        divisor_override=None if divisor_override is None else cx.int(divisor_override),
    )
    return v


def adaptive_output_size(cx: CaptureContext, out: Any, x: Any, output_size: Any, n: int) -> tuple:
    """An adaptive pool's output size over the last ``n`` dims, as eager's result has it, with
    what decided it guarded: a traced size among ``output_size`` is specialized, and so is a
    symbolic input dim a ``None`` entry keeps (the IR op takes ints: a size read from the capture
    sample and left unguarded served that size at every size the symbols took)."""
    sizes = tuple(output_size) if isinstance(output_size, (list, tuple)) else (output_size,) * n
    ty = cx.value(x).type
    assert isinstance(ty, TensorType)
    dims = ty.shape[-n:]
    for s, d in zip(sizes, dims):
        if s is None:
            cx.specialize(d, 0)
        else:
            cx.int(s)
    return tuple(int(s) for s in out.shape[-n:])


@op(F.adaptive_avg_pool2d)
def _adaptive_avg_pool2d(cx: CaptureContext, out: Any, x: Any, output_size: Any) -> Value:
    size = adaptive_output_size(cx, out, x, output_size, 2)
    v: Value = cx.call("adaptive_avg_pool2d", cx.value(x), output_size=size)
    return v


def _bn_train(
    cx: CaptureContext,
    x: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    momentum: Any,
    eps: float,
) -> Value:
    if momentum is None and running_mean is not None:
        cx.limitation(
            "batch_norm with momentum=None (a cumulative average) reads num_batches_tracked's value"
        )
    outs = cx.call(
        "batch_norm_train",
        cx.value(x),
        _opt(cx, weight),
        _opt(cx, bias),
        _opt(cx, running_mean),
        _opt(cx, running_var),
        momentum=float(momentum or 0.0),
        eps=float(eps),
    )
    if running_mean is not None:
        cx.assign(running_mean, outs[1])
        cx.assign(running_var, outs[2])
    y: Value = outs[0]
    return y


@op(F.batch_norm)
def _f_batch_norm(
    cx: CaptureContext,
    out: Any,
    x: Any,
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: Any = 0.1,
    eps: float = 1e-5,
) -> Value:
    if training or running_mean is None:
        return _bn_train(cx, x, weight, bias, running_mean, running_var, momentum, eps)
    v: Value = cx.call(
        "batch_norm",
        cx.value(x),
        _opt(cx, weight),
        _opt(cx, bias),
        cx.value(running_mean),
        cx.value(running_var),
        eps=float(eps),
    )
    return v


@op(torch.batch_norm)
def _torch_batch_norm(
    cx: CaptureContext,
    out: Any,
    x: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: bool,
    momentum: Any,
    eps: float,
    cudnn_enabled: bool = True,
) -> Value:
    return _f_batch_norm(
        cx, out, x, running_mean, running_var, weight, bias, training, momentum, eps
    )


@op(F.layer_norm)
def _layer_norm(
    cx: CaptureContext,
    out: Any,
    x: Any,
    normalized_shape: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> Value:
    shape = normalized_shape if isinstance(normalized_shape, (list, tuple)) else (normalized_shape,)
    v: Value = cx.call(
        "layer_norm",
        cx.value(x),
        _opt(cx, weight),
        _opt(cx, bias),
        normalized_shape=tuple(cx.dim(d) for d in shape),
        eps=float(eps),
    )
    return v


@op(F.group_norm)
def _group_norm(
    cx: CaptureContext,
    out: Any,
    x: Any,
    num_groups: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> Value:
    v: Value = cx.call(
        "group_norm",
        cx.value(x),
        _opt(cx, weight),
        _opt(cx, bias),
        num_groups=cx.int(num_groups),
        eps=float(eps),
    )
    return v


def _dropout(cx: CaptureContext, out: Any, x: Any, p: float, train: bool, inplace: bool) -> Any:
    v = cx.call("dropout", cx.value(x), p=float(p), train=bool(train))
    if inplace:
        return InPlace(x, v)
    # NOTE: eval-mode (or p=0) dropout returns its input itself: an alias with the same value.
    return Viewed(v, x, (ViewStep("identity"),))


@op(F.dropout)
def _f_dropout(
    cx: CaptureContext,
    out: Any,
    x: Any,
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> Any:
    return _dropout(cx, out, x, p, training, inplace)


@op(torch.dropout)
def _torch_dropout(cx: CaptureContext, out: Any, x: Any, p: float, train: bool) -> Any:
    return _dropout(cx, out, x, p, train, False)


@op(torch.dropout_)
def _torch_dropout_(cx: CaptureContext, out: Any, x: Any, p: float, train: bool) -> Any:
    return _dropout(cx, out, x, p, train, True)


@op(F.scaled_dot_product_attention)
def _sdpa(
    cx: CaptureContext,
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Any = None,
    enable_gqa: bool = False,
) -> Value:
    r: Value = cx.call(
        "scaled_dot_product_attention",
        cx.value(q),
        cx.value(k),
        cx.value(v),
        _opt(cx, attn_mask),
        dropout_p=float(dropout_p),
        is_causal=bool(is_causal),
        scale=None if scale is None else float(scale),
        enable_gqa=bool(enable_gqa),
    )
    return r


@op(F.embedding)
def _embedding(
    cx: CaptureContext,
    out: Any,
    indices: Any,
    weight: Any,
    padding_idx: Any = None,
    max_norm: Any = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Value:
    if max_norm is not None:
        cx.limitation("embedding(max_norm=...) renormalizes the weight in place")
    # NOTE: the IR's embedding has eager's forward and the plain (dense, unscaled) gradient;
    # these two change the weight's gradient, so the call goes to its ATen form instead
    if scale_grad_by_freq:
        raise NoIROp("scale_grad_by_freq=True divides the weight's gradient by token counts")
    if sparse and cx.grad_enabled and getattr(weight, "_rg", False):
        cx.limitation(
            "embedding(sparse=True) gives the weight a sparse gradient; plait's programs hold "
            "dense tensors: use sparse=False, or call the embedding outside the compiled function"
        )
    v: Value = cx.call(
        "embedding",
        cx.value(indices),
        cx.value(weight),
        padding_idx=None if padding_idx is None else cx.int(padding_idx),
    )
    return v


@op(*[f for f in (torch.index_select, T.index_select)])
def _index_select(cx: CaptureContext, out: Any, x: Any, dim: Any, index: Any) -> Value:
    v: Value = cx.call("index_select", cx.value(x), cx.value(index), dim=cx.int(dim))
    return v

"""A 1x1 convolution of a few pixels as the linear it is: MKL's packed GEMM of its rows.

A convolution whose kernel is 1x1 (stride 1, no padding, no dilation, one group) reads each
pixel's channels and nothing else: on a channels_last input it is a matrix product of the
``N*H*W`` rows of ``C`` channels with the ``[O, C]`` weight, and its channels_last result is that
product's ``[N*H*W, O]`` rows. A squeeze-and-excitation block's two convolutions (on a 1x1 map)
are almost nothing else but the call: measured on the 2-core AMD EPYC at one thread with cold
caches, as in a model, oneDNN's convolution took 55 us a call, oneDNN's linear with the
activation as a post-op 38 us, and MKL's packed GEMM with the activation as a separate native
kernel 17 us. So a convolution of at most :data:`~plait.codegen.onednn_postops.FEW_ROWS` rows
runs MKL's packed GEMM (where the build has it, in float32), its activation a native kernel
(:func:`plait.codegen.onednn_postops.runs_mkl`). On larger maps oneDNN's convolution stays: its
linear of the rows was not faster inside MobileNet-V2 (1.7% slower, interleaved medians).

Invariants: the input is made channels_last first (its rows are then a view, no copy), the
result has the convolution's channels_last strides, and a weight with a non-finite value runs
eager's convolution (as :func:`plait.codegen.onednn.conv_call` does).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((2, 8, 1, 1), torch.float32))
    >>> w = gb.input("w", TensorType((4, 8, 1, 1), torch.float32))
    >>> gb.output(gb.call("conv2d", x, w, None, stride=[1, 1], padding=[0, 0],
    ...                   dilation=[1, 1], groups=1))
    >>> node = gb.build().nodes[0]
    >>> applies(node, None, mkl_linear=True)
    True
    >>> xs, ws = torch.randn(2, 8, 1, 1), torch.randn(4, 8, 1, 1)
    >>> y = pointwise_conv_call(node, {}).fn(xs, ws, None)
    >>> torch.allclose(y, torch.conv2d(xs, ws), atol=1e-5), tuple(y.shape)
    (True, (2, 4, 1, 1))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from plait.codegen import onednn
from plait.codegen.extern import ExternCall, PreparedWeight, reusable, watched
from plait.codegen.onednn_postops import Epilogue, runs_mkl
from plait.ir.graph import Node, Value
from plait.ir.types import TensorType

CL = torch.channels_last


def applies(node: Node, ep: Epilogue | None, mkl_linear: bool) -> bool:
    """Whether ``node`` is a convolution that runs MKL's packed GEMM of its rows: one of
    :func:`~plait.codegen.onednn_postops.runs_mkl` (then it has no epilogue)."""
    return node.op == "conv2d" and ep is None and runs_mkl(node, mkl_linear)


def pointwise_conv_call(
    node: Node,
    consts: Mapping[Any, torch.Tensor],
    prepack: onednn.Prepacker | None = None,
    packs: onednn.PackedWeights | None = None,
) -> ExternCall:
    """The call of a convolution of :func:`applies`: the weight packed once for the rows (MKL's
    own format for this CPU: never in a cache entry), each call MKL's compute on the rows."""
    x, w = node.inputs[0], node.inputs[1]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    assert isinstance(w, Value) and isinstance(w.type, TensorType)
    n, c, h, wd = (int(d) for d in x.type.shape)
    o = int(w.type.shape[0])
    rows = n * h * wd
    pack = torch.ops.mkl._mkl_reorder_linear_weight
    weight = PreparedWeight(
        lambda w: pack(w.reshape(o, c).contiguous(), rows),
        track_finite=True, portable=False, reuse=reusable(w), watch=watched(w),
    )  # fmt: skip
    key = onednn._pack_key(node, "mkl-rows", rows)
    when = onednn._prepare(weight, consts.get(w), prepack, packs, key, node.id)
    detail = (
        f"1x1 conv2d as MKL's packed linear of its {rows} channels_last rows (weight packed "
        f"{when}; {onednn.NONFINITE_NOTE})"
    )
    eager = onednn._eager_conv([1, 1], [0, 0], [1, 1], 1, None, CL)
    compute = torch.ops.mkl._mkl_linear.default

    def fn(x: Any, w: Any, b: Any) -> Any:
        packed_w = weight(w)
        if not weight.finite:
            return eager(x, w, b, None)
        x_rows = x.contiguous(memory_format=CL).permute(0, 2, 3, 1).reshape(rows, c)
        y = compute(x_rows, packed_w, w.reshape(o, c), b, rows)
        return y.view(n, h, wd, o).permute(0, 3, 1, 2)

    return ExternCall(fn, "conv", detail, "MKL")


def conv_or_linear_call(
    node: Node,
    consts: Mapping[Any, torch.Tensor],
    ep: Epilogue | None,
    channels_last: bool = True,
    prepack: onednn.Prepacker | None = None,
    packs: onednn.PackedWeights | None = None,
    mkl_linear: bool = False,
    hints: Mapping[str, int] | None = None,
    weight: PreparedWeight | None = None,
) -> ExternCall:
    """:func:`plait.codegen.onednn.onednn_call`, except for a convolution of :func:`applies`:
    MKL's packed GEMM of its rows."""
    if applies(node, ep, mkl_linear):
        return pointwise_conv_call(node, consts, prepack, packs)
    args = (channels_last, prepack, packs, mkl_linear, hints, weight)
    return onednn.onednn_call(node, consts, ep, *args)

"""Extern calls specific to CUDA: PyTorch's cuDNN convolution on channels_last activations,
16-bit matrix products on operands padded to multiples of 8 (:mod:`plait.codegen.cuda_padding`),
training-mode batch norm as plait's Triton kernels (:mod:`plait.codegen.cuda_batch_norm`),
sums over leading dims (bias gradients) as plait's Triton column sum
(:mod:`plait.codegen.cuda_column_sum`), and which strided views a matrix product's input is
copied out of first.

A linear or matmul whose batched operand is a view that cannot be flattened to a matrix (the
transposed activations ``nn.MultiheadAttention`` feeds its input projection) makes ATen copy it
with a generic strided copy and pick a slower cuBLAS kernel for the copy's layout (ViT-B/16 on an
H200: 414 us of copies and 768 us of GEMM against 400 us with contiguous inputs, per call). The
planner writes such an operand contiguous in a Triton kernel instead (:func:`copies_operand`).

cuDNN's tensor-core convolutions (16-bit floats) read NHWC: a convolution given an NCHW
activation transposes it internally, every call. Its float32 kernels (TF32 off) read NCHW, and
transpose an NHWC activation instead (measured on an H100, ResNet-50 at batch 1: 3.0 ms NCHW
against 3.5 ms NHWC): float32 convolutions stay NCHW. With ``channels_last`` (the default) a
16-bit CUDA convolution's input is made
channels_last once, where it is not already (the graph's input image, the first convolution),
its constant weight is converted once (rebuilt if the tensor is replaced or written in place),
and cuDNN returns a channels_last result that the next layers keep (the planner stores the
epilogues in the layout of the value they are computed from).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((1, 3, 8, 8), torch.bfloat16))
    >>> w = gb.input("w", TensorType((4, 3, 3, 3), torch.bfloat16))
    >>> gb.output(gb.call("conv2d", x, w, None))
    >>> node = gb.build().nodes[0]
    >>> cuda_call(node, {}, channels_last=True).detail
    'aten.conv2d (cuDNN, channels_last)'
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch

from plait.codegen.cuda_batch_norm import batch_norm_call
from plait.codegen.cuda_padding import padded_linear, padded_matmul
from plait.codegen.extern import Consts, ExternCall, PreparedWeight, outer_sum
from plait.ir.graph import Node, Value
from plait.ir.types import TensorType
from plait.passes.product_alignment import misaligned

CL = torch.channels_last


def cuda_call(node: Node, consts: Consts, channels_last: bool) -> ExternCall | None:
    """The CUDA-specific call for ``node``, or None where PyTorch's generic call is the one."""
    x = node.inputs[0] if node.inputs else None  # NOTE: a factory (full, arange) has none
    rank4 = isinstance(x, Value) and isinstance(x.type, TensorType) and x.type.rank == 4
    half = rank4 and x.type.dtype in (torch.bfloat16, torch.float16)  # type: ignore[union-attr]
    if node.op == "conv2d" and channels_last and half:
        return _conv2d_channels_last(node, consts)
    if node.op == "sum" and outer_sum(node):
        # NOTE: imported here: Triton decides at a kernel's definition whether it interprets
        from plait.codegen.cuda_column_sum import column_sum

        dims, keepdim = tuple(node.attrs["dims"]), bool(node.attrs["keepdim"])
        return ExternCall(
            lambda t: column_sum(t, dims, keepdim),
            "reduction",
            "Triton column sum, two stages (ATen's sum for a strided input)",
        )
    if misaligned(node):
        fn = padded_linear if node.op == "linear" else padded_matmul
        detail = f"aten.{node.op} (operands zero-padded to multiples of 8 for cuBLAS)"
        return ExternCall(fn, "matmul", detail)
    return batch_norm_call(node)


MATRIX_PRODUCTS = frozenset({"linear", "matmul"})


def flattens(shape: tuple[Any, ...], strides: tuple[Any, ...]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` reshapes to ``(-1, shape[-1])`` as a view
    with unit last stride (dims of size 1 are ignored).

    >>> flattens((4, 2, 8), (16, 8, 1)), flattens((4, 2, 8), (8, 32, 1))
    (True, False)
    """
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return True
    if dims[-1][1] != 1:
        return False
    return all(s == s_next * n_next for (_, s), (n_next, s_next) in pairwise(dims))


def copies_operand(node: Node, k: int, shape: tuple[Any, ...], strides: tuple[Any, ...]) -> bool:
    """Whether CUDA's matrix product ``node`` should get its operand ``k`` (a strided view of
    ``shape`` and ``strides``) copied contiguous first: the batched operand of a linear or of a
    matmul by a matrix, of rank 3 or more, that does not flatten to a matrix as a view. A
    transposed matrix is left alone: cuBLAS reads it in place."""
    if node.op not in MATRIX_PRODUCTS or k != 0 or len(shape) < 3:
        return False
    if node.op == "matmul":
        other = node.inputs[1]
        if not (isinstance(other, Value) and isinstance(other.type, TensorType)):
            return False
        if other.type.rank != 2:
            return False
    return not flattens(shape, strides)


def _conv2d_channels_last(node: Node, consts: Consts) -> ExternCall:
    a = node.attrs
    stride, padding, dilation, groups = a["stride"], a["padding"], a["dilation"], a["groups"]
    conv = torch.conv2d
    w_value = node.inputs[1]
    constant = isinstance(w_value, Value) and w_value in consts
    prepared = PreparedWeight(lambda w: w.contiguous(memory_format=CL))

    def fn(x: Any, w: Any, b: Any) -> Any:
        if not x.is_contiguous(memory_format=CL):
            x = x.contiguous(memory_format=CL)
        if constant:
            w = prepared(w)
        return conv(x, w, b, stride, padding, dilation, groups)

    return ExternCall(fn, "conv", "aten.conv2d (cuDNN, channels_last)")

"""Which 16-bit CUDA matrix products run slow kernels: those with a dimension that is not a
multiple of 8 (cuBLAS's Hopper tensor-core kernels read operands through leading dimensions of
16-byte multiples). Read by the ``pad-products`` pass (:mod:`plait.passes.pad_products`) and
by the CUDA backend's run-time padding (:mod:`plait.codegen.cuda_padding`).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((64, 768), torch.bfloat16, "cuda:0"))
    >>> w = gb.input("w", TensorType((50257, 768), torch.bfloat16, "cuda:0"))
    >>> gb.output(gb.call("linear", x, w))
    >>> node = gb.build().nodes[0]
    >>> dims_of(node), misaligned(node)
    ((64, 768, 50257), True)
"""

from __future__ import annotations

import torch

from plait.ir.graph import Node, Value
from plait.ir.types import TensorType

ALIGN = 8
HALF = (torch.bfloat16, torch.float16)


def dims_of(node: Node) -> tuple[int, ...] | None:
    """The static (M, K, N) of a 16-bit CUDA linear or matmul by a matrix; None otherwise."""
    if node.op not in ("linear", "matmul") or len(node.inputs) < 2:
        return None
    x, w = node.inputs[0], node.inputs[1]
    if not (isinstance(x, Value) and isinstance(w, Value)):
        return None
    tx, tw = x.type, w.type
    if not (isinstance(tx, TensorType) and isinstance(tw, TensorType)):
        return None
    if not tx.device.startswith("cuda") or tx.dtype not in HALF or tw.dtype != tx.dtype:
        return None
    if tw.rank != 2 or tx.rank < 2 or not (tx.is_static and tw.is_static):
        return None
    m, k = int(tx.shape[-2]), int(tx.shape[-1])
    n = int(tw.shape[0] if node.op == "linear" else tw.shape[1])
    return m, k, n


def misaligned(node: Node) -> bool:
    """Whether ``node`` is a 16-bit CUDA product with K or N not a multiple of 8, or a matmul
    whose matrix operand's M is not (it is a leading dimension if the operand is transposed)."""
    dims = dims_of(node)
    if dims is None:
        return False
    x = node.inputs[0]
    assert isinstance(x, Value) and isinstance(x.type, TensorType)
    m, k, n = dims
    rows = node.op == "matmul" and x.type.rank == 2 and m % ALIGN != 0
    return k % ALIGN != 0 or n % ALIGN != 0 or rows

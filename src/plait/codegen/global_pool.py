"""A classifier's global average pool (``adaptive_avg_pool2d`` to 1x1 of a float32 map) as one
native kernel instead of ATen's.

ATen pools a channels_last map with a mean over its pixels: a reduction, a fill and a division,
each through the dispatcher and TensorIterator. Hot, that is about 8 us for a 1280-channel 7x7
map; after the convolutions before it have run, their code and ATen's are out of the CPU's
caches, and the same call took 90-120 us inside EfficientNet-B0 and the MobileNets
(benchmarks/RESULTS.md). ``csrc/global_pool.h`` sums each channel's pixels in order and divides
by their count (the contract's reduction budget; NaN and infinities propagate as in eager's
sum), writing the arena buffer the memory plan gives the result. A squeeze-and-excitation pool
of a depthwise call's result is that call's instead (:class:`plait.codegen.depthwise_conv.
PooledMeans`).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((2, 8, 3, 3), torch.float32))
    >>> gb.output(gb.call("adaptive_avg_pool2d", x, output_size=[1, 1]))
    >>> g = gb.build()
    >>> pool = g.nodes[0]
    >>> find_global_pool(pool) is pool
    True
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

from plait.codegen.depthwise_conv import float32_static, global_pool
from plait.codegen.extern import ExternCall
from plait.codegen.native_entries import build_entries, shipped
from plait.codegen.native_launch import NativeLaunch
from plait.ir.graph import Node

CL = torch.channels_last
SYMBOL = "plait_global_pool"


def find_global_pool(node: Node) -> Node | None:
    """``node`` where it is an ``adaptive_avg_pool2d`` to 1x1 of a static float32 CPU map (a
    ``mean`` over the pixels is a native reduction of the C++ printer already)."""
    return node if node.op == "adaptive_avg_pool2d" and global_pool(node) else None


def source() -> str:
    """The kernel's C++ as shipped (``csrc/global_pool.h``)."""
    return shipped("global_pool.h")


def kernel() -> Any:
    """The C entry, built once per machine through the kernel cache (raises
    :class:`~plait.codegen.errors.BuildError` where it cannot be built)."""
    return build_entries(source(), {SYMBOL: "gp::entry(p, f)"})[SYMBOL]


def global_pool_call(pool: Node) -> ExternCall:
    """The call of ``pool`` (operand: the map; ``out``: the result's buffer, else a new one),
    its result ``[N, C, 1, 1]`` in channels_last strides."""
    fn = kernel()
    xt = float32_static(pool.inputs[0], 4)
    assert xt is not None
    n, c, h, w = (int(d) for d in xt.shape)
    sizes = (c, 1, c, c)
    params = (ctypes.c_int64 * 5)(0, 0, n, h * w, c)
    empty = torch.empty_strided

    def call(x: Any, out: Any = None) -> Any:
        y = empty((n, c, 1, 1), sizes, dtype=torch.float32) if out is None else out
        x = x.contiguous(memory_format=CL)
        params[0], params[1] = x.data_ptr(), y.data_ptr()
        fn(params, None)  # NOTE: the call holds x (the kernel reads its memory)
        return y

    detail = "native global average pool, channels_last (each channel's pixels summed in order)"
    launch = NativeLaunch(fn, params, None, slots=(0,), out=1)
    return ExternCall(call, "reduction", detail, "native", sizes, (SYMBOL,), launch)

"""plait.codegen (L5): fusion, the loop-level kernel IR, the C++ printer, the build cache.

Fused groups of IR nodes become kernels of one small kernel IR (:mod:`plait.codegen.kir`),
printed to C++ (:mod:`plait.codegen.cpp`) and built by the system compiler into cached shared
libraries (:mod:`plait.codegen.build`). Heavy ops are extern calls into PyTorch
(:mod:`plait.codegen.extern`). The executor lives in :mod:`plait.runtime`.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.codegen import plan_graph
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4,), torch.float32))
    >>> gb.output(gb.call("exp", gb.call("neg", x)))
    >>> [k.kernel.nodes for k in plan_graph(gb.build()).kernels]
    [(0, 1)]
"""

from plait.codegen.errors import BuildError, CodegenError
from plait.codegen.fusion import classify, plan_graph
from plait.codegen.kir import Kernel, KernelBuilder
from plait.codegen.options import StaxOptions
from plait.codegen.placement import Loc
from plait.codegen.plan import NodeTag, Plan

__all__ = [
    "BuildError",
    "CodegenError",
    "Kernel",
    "KernelBuilder",
    "Loc",
    "NodeTag",
    "Plan",
    "StaxOptions",
    "classify",
    "plan_graph",
]

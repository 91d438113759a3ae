"""plait.runtime: the Stax executor.

``compile_graph(graph)`` turns an IR graph into a :class:`StaxProgram`: a callable running a
straight-line schedule of native C++ kernels and PyTorch extern calls, with a static memory plan.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.runtime import compile_graph
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((3,), torch.float32))
    >>> gb.output(gb.call("add", x, 1.0))
    >>> compile_graph(gb.build())(torch.zeros(3))
    [tensor([1., 1., 1.])]
"""

from plait.codegen.errors import CodegenError
from plait.codegen.options import StaxOptions
from plait.runtime.memory import BufferPlan, MemoryPlan
from plait.runtime.program import (
    Evidence,
    KernelInfo,
    StaxProgram,
    compile_graph,
    compile_graphs,
)
from plait.runtime.runner_calls import StaxInputError

__all__ = [
    "BufferPlan",
    "CodegenError",
    "Evidence",
    "KernelInfo",
    "MemoryPlan",
    "StaxInputError",
    "StaxOptions",
    "StaxProgram",
    "compile_graph",
    "compile_graphs",
]

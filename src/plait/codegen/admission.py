"""What Stax compiles: the graph check (device, target, symbolic dims) and each node's kind.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4,), torch.float32))
    >>> gb.output(gb.call("relu", x))
    >>> graph = gb.build()
    >>> check_graph(graph)
    >>> [classify(n) for n in graph.nodes]
    [('pointwise', '')]
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from plait.codegen.datadep import touches_unbacked
from plait.codegen.errors import CodegenError
from plait.codegen.extern import EXTERN_RULES, FLOAT_EXTERNS, outer_sum
from plait.codegen.reductions import TEMPLATES
from plait.codegen.scalar import RULES
from plait.codegen.symbolic_shapes import attr_sizes, check_symbolic
from plait.codegen.views import MAPPED_VIEWS, SELECT_VIEWS
from plait.ir.graph import Graph, Node, Value
from plait.ir.ops import get_op
from plait.ir.types import TensorType

CONSTANTS = frozenset({"full", "zeros", "ones", "arange"})


def classify(node: Node) -> tuple[str, str]:
    """``(kind, reason)``: kind is extern, pointwise, reduction, view, constant or fallback."""
    op = node.op
    if touches_unbacked(node):
        return "extern", ""  # NOTE: a PyTorch call, its results PyTorch's (codegen.datadep)
    if op in EXTERN_RULES and _extern_applies(node):
        return "extern", ""
    if op == "dropout":
        if get_op(op).is_random(node.attrs):
            return "fallback", "dropout in training draws from PyTorch's RNG stream"
        return "view", ""
    for v in node.input_values():
        if not isinstance(v.type, TensorType):
            return "fallback", f"reads the runtime scalar %{v.name}"
    if op in RULES:
        return "pointwise", ""
    if op in TEMPLATES:
        return "reduction", ""
    if op in MAPPED_VIEWS or op in SELECT_VIEWS:
        return "view", ""
    if op in CONSTANTS:
        return "constant", ""
    if op == "opaque":
        return "fallback", f"opaque call to {node.attrs['target']}"
    return "fallback", f"no Stax lowering for {op}"


def _extern_applies(node: Node) -> bool:
    """Ops with an extern rule for some of their nodes only: floating fmod/remainder, outer
    sums."""
    if node.op in FLOAT_EXTERNS:
        return _float_result(node)
    if node.op == "sum":
        return outer_sum(node)
    return True


def _float_result(node: Node) -> bool:
    t = node.outputs[0].type
    return isinstance(t, TensorType) and t.dtype.is_floating_point


TARGETS = ("cpu", "triton")


def graph_device(graph: Graph) -> str:
    """The one device of ``graph``'s tensors (``cpu`` when it has none); a graph whose tensors
    span devices is a clear error."""
    devices = {v.type.device for v in _all_values(graph) if isinstance(v.type, TensorType)}
    if len(devices) > 1:
        raise CodegenError(f"the Stax backend compiles one device per graph, got {sorted(devices)}")
    return devices.pop() if devices else "cpu"


def check_graph(graph: Graph, target: str = "cpu") -> None:
    """Stax compiles C++ kernels on the CPU (``target="cpu"``, static and symbolic shapes) and
    Triton kernels on CUDA (``"triton"``, static shapes; on CPU tensors too, where Triton
    interprets them); anything else is a clear error. Unbacked dims (data-dependent sizes) are
    read and made by PyTorch calls only (:func:`check_symbolic` says what else is refused)."""
    if target not in TARGETS:
        raise CodegenError(f"unknown Stax target {target!r}; known: {list(TARGETS)}")
    device = graph_device(graph)
    if target == "cpu" and device != "cpu":
        raise CodegenError(
            f"the Stax CPU target got tensors on {device}: Triton kernels run them "
            "(StaxOptions(target='triton'))"
        )
    if target == "triton" and not (device == "cpu" or device.startswith("cuda")):
        raise CodegenError(f"the Stax Triton target runs CUDA tensors, got {device}")
    if target == "triton" and device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise CodegenError(
            "Triton kernels on CPU tensors run only in Triton's interpreter: set "
            "TRITON_INTERPRET=1 before triton is imported (or use the cpu target)"
        )
    check_symbolic(graph, target)
    for node in graph.nodes:
        if not touches_unbacked(node) and attr_sizes(node) and classify(node)[0] == "extern":
            # NOTE: an extern's attributes are bound once, when its call is made
            raise CodegenError(
                f"an extern call with symbolic attributes ({node.attrs}) is not compiled "
                "symbolically (specialize the sizes)",
                node_id=node.id,
                op=node.op,
            )


def _all_values(graph: Graph) -> Iterator[Value]:
    yield from graph.inputs
    for n in graph.nodes:
        yield from n.outputs


def live_nodes(graph: Graph) -> set[int]:
    """Nodes whose results reach an output (random nodes always run: they advance the RNG)."""
    live: set[int] = set()
    needed = {id(o) for o in graph.outputs if isinstance(o, Value)}
    for node in reversed(graph.nodes):
        random = get_op(node.op).is_random(node.attrs)
        if random or any(id(v) in needed for v in node.outputs):
            live.add(node.id)
            needed.update(id(v) for v in node.input_values())
    return live

"""A reshape of a fused pointwise value, read as a view of the value's own buffer.

A pointwise chain that ends in a reshape an extern reads (a linear's backward: GELU's
derivative, then ``reshape`` to the matrix that both gradient products multiply) was
materialized in the reshape's shape, which differs from the chain's: the open kernel closed
there, and the chain ran as two kernels with a buffer between them (GPT-2's MLP backward on
an H200: 34 + 48 us per layer, the buffer in float32). Materializing the reshape's *input*
instead, in the chain's shape, joins the open kernel; the reshape is then a contiguous view of
that buffer (no code). Only where the view comes out contiguous: a transposed or offset view
would make the extern copy it, or read it another way; and only where it holds every element
of the value: for a part (a select, a first chunk) the base would be computed whole.
"""

from __future__ import annotations

from typing import Any

from plait.codegen.index import contiguous_strides
from plait.codegen.placement import Loc
from plait.codegen.plan import NodeTag
from plait.codegen.views import sizes_of
from plait.ir.graph import Node, Value
from plait.ir.types import COMPLEX_DTYPES, TensorType


def materialize_base(planner: Any, node: Node, k: int) -> bool:
    """Where ``node`` (a view) makes output ``k`` that needs a buffer and reads an inline
    pointwise value: materialize that value (joining the open kernel of its shape) and place
    the output as a contiguous view of it; False, changing nothing, where that view would not
    be contiguous. ``planner``: the fusion planner (its locs, layout, materialize, view_loc)."""
    x, v = node.inputs[0], node.outputs[k]
    if not planner.fuse or planner.locs[v].kind != "inline" or not planner.needs_buffer(v):
        return False
    if id(v) in planner.outputs or not isinstance(x, Value) or x.producer is None:
        return False
    inline = planner.locs.get(x)
    if inline is None or inline.kind != "inline" or planner.kind(x.producer) != "pointwise":
        return False
    if not isinstance(x.type, TensorType) or x.type.dtype in COMPLEX_DTYPES:
        return False
    if not isinstance(v.type, TensorType) or v.type.numel != x.type.numel:
        # NOTE: a view of part of the value (``tanh(a)[0]``, a first chunk) is contiguous at
        # offset 0 too, but materializing its base would compute all of it for that part
        return False
    planner.locs[x] = Loc("buffer", x, 0, planner.layout(x))
    view = planner.view_loc(node, k)
    planner.locs[x] = inline
    contiguous = contiguous_strides(sizes_of(v.type))
    if view.kind != "view" or view.offset != 0 or tuple(view.strides) != tuple(contiguous):
        return False
    if _computed_inline_by_open_kernel(planner, x):
        # NOTE: a member of the open kernel computed ``x`` inline (a graph output ``x * 2``
        # of its shape); joining it there, that member would load ``x``'s buffer before the
        # kernel's store of ``x`` (one loop nest, members in order): what the buffer held before
        planner.close()
    planner.materialize(x)
    planner.locs[v] = planner.view_loc(node, k)
    planner.tags[node.id] = NodeTag("native", "strided view (no code)")
    return True


def _computed_inline_by_open_kernel(planner: Any, x: Value) -> bool:
    """Whether the open kernel (not yet emitted) computes ``x``'s producer inline for one of
    its members."""
    kernel = planner._open_kernel
    return kernel is not None and x.producer is not None and x.producer.id in kernel.covered


COMPLEX_VIEW_COPY = (
    "a view of a complex tensor the program returns: PyTorch's view, copied (Stax kernels "
    "compute real dtypes only)"
)


def complex_value(v: Value) -> bool:
    """Whether ``v`` is a complex tensor (no Stax kernel computes one)."""
    return isinstance(v.type, TensorType) and v.type.dtype in COMPLEX_DTYPES

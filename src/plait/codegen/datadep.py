"""Nodes that read or make a value of data-dependent size: PyTorch calls, outside the plan.

An ``aten_datadep`` node (``nonzero``, ``unique``, ``x[mask]``) and every node that reads its
result until a static shape is reached (``sum``, ``mean``, a cast, a transpose: what capture
admits, :mod:`plait.frontend.datadep`) run as extern calls: the ATen overload, or the op's own
PyTorch reference implementation. Their results are allocated by PyTorch with whatever size
the call returns (memory home ``torch``); the memory planner and the native kernels never see
an unbacked dim. A static result of such a call (``x[mask].sum()``) is an ordinary buffer,
conformed to contiguous strides, that native kernels may read.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4,), torch.float32))
    >>> (picked,) = gb.call("aten_datadep", [x, gb.call("gt", x, 0.0)], name="masked_select",
    ...                     sizes="dd0")
    >>> total = gb.call("sum", picked)
    >>> call = datadep_call(total.producer, {})
    >>> call.detail, float(call.fn(torch.tensor([1.0, 2.0])))
    ('sum (PyTorch reference: reads a data-dependent size)', 3.0)
"""

from __future__ import annotations

from typing import Any

import sympy

from plait.codegen.extern import ExternCall
from plait.ir.graph import Node
from plait.ir.ops import get_op
from plait.ir.types import TensorType
from plait.symbolic import evaluate, has_unbacked

DATADEP_OP = "aten_datadep"


def unbacked(t: Any) -> bool:
    return isinstance(t, TensorType) and has_unbacked(t.shape)


def touches_unbacked(node: Node) -> bool:
    """Whether ``node`` reads or makes a value of data-dependent size."""
    return node.op == DATADEP_OP or any(
        unbacked(v.type) for v in (*node.input_values(), *node.outputs)
    )


def datadep_call(node: Node, sizes: dict[str, int]) -> ExternCall:
    """How Stax runs a node that :func:`touches_unbacked`: the overload of an ``aten_datadep``
    node, else the op's reference implementation (the interpreter's, PyTorch's kernels).

    ``sizes`` is the program's table of unbacked sizes for the call running (calls of one
    program are serialized): the node that makes a size writes it there, and a node whose
    attributes or literal operands hold it (``reshape`` to ``(2*dd0,)``, which a pass may make
    of ``flatten``) reads it there."""
    if node.op == DATADEP_OP:
        return _datadep_node(node, sizes)
    opdef = get_op(node.op)
    run = opdef.run
    op_class = _OP_CLASS.get(opdef.category.value, "reduction")
    attrs = dict(node.attrs)
    single = len(node.outputs) == 1
    symbolic = any(_symbolic(v) for v in (*attrs.values(), *node.inputs))

    def fn(*operands: Any) -> Any:
        a = attrs
        if symbolic:
            a = {k: _concrete(v, sizes) for k, v in attrs.items()}
            operands = tuple(_concrete(o, sizes) for o in operands)
        results = run(list(operands), a)
        return results[0] if single else results

    return ExternCall(fn, op_class, f"{node.op} (PyTorch reference: reads a data-dependent size)")


def _datadep_node(node: Node, sizes: dict[str, int]) -> ExternCall:
    from plait.ir.ops.aten import bind_call

    a = node.attrs
    call = bind_call(a["name"], a["overload"], a["literals"], a["kwliterals"], len(node.inputs))
    detail = f"aten.{a['name']}" + ("" if a["overload"] == "default" else f".{a['overload']}")
    # NOTE: (output, dim, name) of each unbacked size the node makes
    made = [
        (k, d, str(dim))
        for k, v in enumerate(node.outputs)
        if isinstance(v.type, TensorType)
        for d, dim in enumerate(v.type.shape)
        if isinstance(dim, sympy.Symbol)
    ]

    def fn(tensors: list[Any]) -> Any:
        out = call(tensors)
        results = out if isinstance(out, (tuple, list)) else (out,)
        for k, d, name in made:
            sizes[name] = int(results[k].shape[d])
        return out

    return ExternCall(fn, "data_movement", f"{detail} (data-dependent size)")


def _symbolic(v: Any) -> bool:
    if isinstance(v, sympy.Expr):
        return bool(v.free_symbols)
    return isinstance(v, (tuple, list)) and any(_symbolic(x) for x in v)


def _concrete(v: Any, sizes: dict[str, int]) -> Any:
    if isinstance(v, sympy.Expr):
        return evaluate(v, sizes)
    if isinstance(v, tuple):
        return tuple(_concrete(x, sizes) for x in v)
    if isinstance(v, list):
        return [_concrete(x, sizes) for x in v]
    return v


# NOTE: the contract row a conformance check of such a node uses, by the op's category
_OP_CLASS = {"pointwise": "pointwise", "view": "data_movement", "reduction": "reduction"}

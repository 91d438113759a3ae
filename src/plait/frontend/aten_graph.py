"""What an ATen graph traced from a call is (:mod:`plait.frontend.aten_trace` traces it): the
functional forms of its in-place and view ops, which of its nodes are one tensor, and whether it
is a faithful functional program (:func:`check_graph`).

NOTE: an in-place op left inside a composite is its functional form (:func:`rebinding`) only
when it writes fresh tensors (:func:`writes_fresh`: made in the call by an op that views
nothing, no view of them taken); any other write to an input but functionalization's
write-back (:func:`input_write`) makes the graph unfaithful.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from plait.ir.ops.aten import RUNTIME_CHECKS
from plait.ir.types import DTYPE_NAMES

aten = torch.ops.aten


# NOTE: ATen ops whose result is a Python value read from tensor data
_DATA_READS = {aten._local_scalar_dense.default, aten.item.default}


_REFUSED_TAGS = {
    torch.Tag.dynamic_output_shape: "has an output shape that depends on the values",
    torch.Tag.data_dependent_output: "computes a Python value from tensor data",
}


def _static_tensor(val: Any) -> bool:
    return (
        isinstance(val, torch.Tensor)
        and val.dtype in DTYPE_NAMES
        and all(isinstance(d, int) for d in val.shape)
    )


def out_of_place(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional overload of an in-place op that writes its first argument alone:
    ``add_.Tensor`` -> ``add.Tensor``, ``copy_`` -> ``copy``, and for an in-place view op its
    ``_copy`` form (``squeeze_.dim`` -> ``squeeze_copy.dim``, ``t_`` -> ``t_copy``); else None.

    NOTE: ``as_strided_`` has none: its result depends on the storage layout of the tensor it
    restrides, which the IR (values, not storage) does not describe."""
    name = op._schema.name.split("::", 1)[1]
    if (
        _written(op) != [0]
        or not name.endswith("_")
        or name.startswith("_")
        or name == "as_strided_"
    ):
        return None
    pure = getattr(getattr(aten, name[:-1], None), op._overloadname, None)
    if not isinstance(pure, torch._ops.OpOverload) or pure._schema.is_mutable:
        return None
    return functional_form(pure)


def _written(op: torch._ops.OpOverload) -> list[int]:
    return [
        i
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


def rebinding(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, list[int]] | None:
    """``(functional op, written argument positions)`` for a mutable overload: an in-place op's
    :func:`out_of_place` form (it returns the new value of argument 0), else the overload's
    ``_functional`` variant (``rrelu_with_noise`` -> ``rrelu_with_noise_functional``), which
    returns the op's results and then the new value of each written argument. None when
    there is neither."""
    pure = out_of_place(op)
    if pure is not None:
        return pure, [0]
    name = op._schema.name.split("::", 1)[1]
    packet = getattr(aten, f"{name}_functional", None)
    functional = getattr(packet, op._overloadname, None) if packet is not None else None
    if not isinstance(functional, torch._ops.OpOverload):
        return None
    fs = functional._schema
    if fs.is_mutable or any(r.alias_info is not None for r in fs.returns):
        return None
    written = _written(op)
    if len(fs.returns) != len(op._schema.returns) + len(written):
        return None
    return functional, written


def _aliasing(node: Any) -> bool:
    target = getattr(node, "target", None)
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None for r in target._schema.returns)


def _same_tensor(node: Any) -> bool:
    """Whether ``node`` is an in-place op whose result is its first argument, the same tensor
    (``fill_``, ``sub_``, ``squeeze_``)."""
    target = getattr(node, "target", None)
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.returns:
        return False
    ret = target._schema.returns[0].alias_info
    arg = target._schema.arguments[0].alias_info if target._schema.arguments else None
    return ret is not None and ret.is_write and arg is not None and ret.before_set == arg.before_set


def tensor_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node that made the tensor ``node`` is (through a chain of in-place ops)."""
    while (
        node.op == "call_function"
        and _same_tensor(node)
        and isinstance(node.args[0], torch.fx.Node)
    ):
        node = node.args[0]
    return node


def same_tensor_nodes(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """Per root (:func:`tensor_root`), the nodes that are that one tensor: the root and the
    in-place ops that wrote it and returned it."""
    members: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        members.setdefault(tensor_root(node), []).append(node)
    return members


def _fresh(root: torch.fx.Node, members: list[torch.fx.Node]) -> bool:
    """Whether the tensor made by ``root`` is made inside the call by an op that views nothing,
    and no view of it is taken (by any node that is that tensor): then writing it in place and
    rebinding it to the new value compute the same."""
    if root.op != "call_function":
        return False
    maker = root.args[0] if root.target.__module__ == "_operator" else root  # NOTE: getitem
    if not isinstance(maker, torch.fx.Node) or maker.op != "call_function" or _aliasing(maker):
        return False
    same = set(members)
    return not any(_aliasing(u) and u not in same for m in members for u in m.users)


def node_arg(node: torch.fx.Node, op: torch._ops.OpOverload, i: int) -> Any:
    if i < len(node.args):
        return node.args[i]
    return node.kwargs.get(op._schema.arguments[i].name)


def writes_fresh(node: torch.fx.Node, members: dict[torch.fx.Node, list[torch.fx.Node]]) -> bool:
    """Whether the mutable op ``node`` (inside a composite that functionalization does not see
    into) has a :func:`rebinding` and writes only fresh tensors (:func:`_fresh`)."""
    target: Any = node.target
    found = rebinding(target)
    if found is None:
        return False
    for i in found[1]:
        dst = node_arg(node, target, i)
        if not isinstance(dst, torch.fx.Node):
            return False
        root = tensor_root(dst)
        if not _fresh(root, members.get(root, [root])):
            return False
    return True


def input_write(node: torch.fx.Node, placeholders: set[torch.fx.Node]) -> bool:
    """Whether ``node`` is functionalization's write-back of an input (``copy_`` into it)."""
    return node.target is aten.copy_.default and node.args[0] in placeholders


def check_graph(gm: torch.fx.GraphModule, writes_inputs: bool = False) -> str | None:
    """Why the ATen graph is not a faithful functional program, or None. ``writes_inputs``: the
    call writes its tensor arguments in place (functionalization's ``copy_`` into them are then
    the writes the caller rebinds)."""
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    members = same_tensor_nodes(gm)
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_method"):
            return f"the traced graph has a {node.op} node"
        if node.op == "get_attr" and not isinstance(getattr(gm, node.target), torch.Tensor):
            kind = type(getattr(gm, node.target)).__name__
            return f"the traced graph holds a {kind}, not a tensor (a torch.Generator argument?)"
        if node.op != "call_function":
            continue
        target = node.target
        if input_write(node, placeholders):
            if not writes_inputs or node.users:
                return "it writes an input in place"
            continue
        if target.__module__ == "_operator" and target.__name__ == "getitem":
            continue
        if not isinstance(target, torch._ops.OpOverload) or target.namespace != "aten":
            return f"the traced graph calls {target}, not an ATen operator"
        if target in _DATA_READS:
            return "it reads tensor data into a Python value (item())"
        if target in RUNTIME_CHECKS:
            continue  # NOTE: an aten_check node, run in program order
        for tag, why in _REFUSED_TAGS.items():
            if tag in target.tags:
                return f"aten.{target.__name__} {why}"
        if target._schema.is_mutable and not writes_fresh(node, members):
            return f"aten.{target.__name__} writes its arguments"
        vals = node.meta.get("val")
        leaves = vals if isinstance(vals, (tuple, list)) else [vals]
        if not leaves or not all(_static_tensor(v) for v in leaves):
            return f"aten.{target.__name__} returns something other than static-shape tensors"
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    results = output.args[0]
    if results is None:
        return None  # NOTE: a call run for its checks alone
    leaves = list(results) if isinstance(results, (tuple, list)) else [results]
    # NOTE: a None among the results (``need_weights=False``'s weights) stays None: which
    # results are None is the traced program's structure, fixed by the call's literals
    if not all(x is None or isinstance(x, torch.fx.Node) for x in leaves):
        return "a result is not a tensor the graph computes"
    return None


def written_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the placeholders the graph writes back (functionalization's ``copy_``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = {n.args[0] for n in gm.graph.nodes if input_write(n, set(placeholders))}
    return [i for i, p in enumerate(placeholders) if p in found]


def functional_form(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``op``, or for a view op left in the functionalized graph (inside a composite that
    functionalization does not see into) its ``_copy`` form: in a graph that writes nothing,
    a view and its copy hold the same values. None for a view op with no ``_copy`` form."""
    if not any(r.alias_info is not None for r in op._schema.returns):
        return op
    if op._schema.is_mutable:
        return None
    packet = getattr(aten, f"{op._schema.name.split('::', 1)[1]}_copy", None)
    found = getattr(packet, op._overloadname, None) if packet is not None else None
    return found if isinstance(found, torch._ops.OpOverload) else None

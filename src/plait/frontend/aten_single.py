"""A builtin torch function that is one ATen overload, as a one-node ATen graph.

A builtin torch function (``torch.linalg.eigvalsh``, ``torch.linalg.norm``) is PyTorch's binding
of the ATen operator of the same name: calling the overload its arguments select computes what
the function computes, by the same kernel. Decomposing it instead (``make_fx``) can take another
path than eager: a composite that asks whether a gradient may be needed
(``_may_require_fw_or_bw_grad``) answers yes for the fake tensors of a trace, so ``eigvalsh``
traces to ``_linalg_eigh`` computing eigenvectors too and ``matrix_norm(ord=2)`` to a full SVD,
whose values differ from eager's in the last bits. :func:`single_node_graph` gives the call as
the one overload instead (its result types from the overload's meta kernel), for the caller to
check against eager like any ATen graph.

Example:
    >>> import torch
    >>> gm, tensors = single_node_graph(torch.linalg.eigvalsh, (torch.eye(3),), {})
    >>> [n.target for n in gm.graph.nodes if n.op == "call_function"]
    [<OpOverload(op='aten.linalg_eigvalsh', overload='default')>]
"""

from __future__ import annotations

import operator
import types
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as torch_pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from plait.frontend.op_names import public_name

# NOTE: the Python namespaces of builtin torch functions and the prefix their ATen names take
_PREFIXES = (
    ("torch.linalg.", "linalg_"),
    ("torch.special.", "special_"),
    ("torch.fft.", "fft_"),
    ("torch.nn.functional.", ""),
    ("torch.Tensor.", ""),
    ("torch.", ""),
)


def aten_name(func: Any) -> str | None:
    """The ATen operator a builtin torch function binds (``torch.linalg.eigvalsh`` ->
    ``linalg_eigvalsh``), or None for a Python function or an unknown name."""
    if not isinstance(func, (types.BuiltinFunctionType, types.MethodDescriptorType)):
        return None
    name = public_name(func)
    if name is None:
        return None
    for prefix, aten_prefix in _PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix) :]
            return aten_prefix + rest if rest.isidentifier() else None
    return None


def distinct_tensors(leaves: list[Any]) -> list[torch.Tensor]:
    """The tensors among ``leaves``, each once (first place first): one tensor passed as two
    arguments is one input of the graph, so the call sees ``q is k`` as eager's does
    (``multi_head_attention_forward`` projects such a call with one packed product, whose bits
    differ from three products')."""
    out: dict[int, torch.Tensor] = {}
    for x in leaves:
        if isinstance(x, torch.Tensor):
            out.setdefault(id(x), x)
    return list(out.values())


def single_node_graph(
    func: Any, pargs: Any, pkwargs: Any
) -> tuple[torch.fx.GraphModule, list[Any]] | str:
    """The call as one ATen overload over its tensor arguments (in pytree order), or why not.

    NOTE: only a functional, deterministic overload (a random one draws through its
    decomposition's random ops, an in-place or aliasing one is no value of the IR)."""
    name = aten_name(func)
    packet = getattr(torch.ops.aten, name, None) if name is not None else None
    if packet is None:
        return "it is no builtin binding of an ATen operator"
    try:
        overload = getattr(packet, torch._C._jit_resolve_packet(f"aten::{name}", *pargs, **pkwargs))
    except Exception as exc:
        return f"no overload of aten.{name} takes these arguments ({type(exc).__name__})"
    schema = overload._schema
    if schema.is_mutable or any(r.alias_info is not None for r in schema.returns):
        return f"aten.{name} writes or aliases its arguments"
    if torch.Tag.nondeterministic_seeded in overload.tags or not schema.returns:
        return f"aten.{name} draws random numbers or returns nothing"
    leaves, spec = torch_pytree.tree_flatten((pargs, pkwargs))
    tensors = distinct_tensors(leaves)  # NOTE: as the ATen trace's inputs
    place = {id(t): i for i, t in enumerate(tensors)}
    graph = torch.fx.Graph()
    nodes = [graph.placeholder(f"t{i}") for i in range(len(tensors))]
    fake_mode = FakeTensorMode()
    fakes = [_fake(fake_mode, t) for t in tensors]
    args, kwargs = torch_pytree.tree_unflatten(
        [nodes[place[id(x)]] if isinstance(x, torch.Tensor) else x for x in leaves], spec
    )
    fake_args, fake_kwargs = torch_pytree.tree_unflatten(
        [fakes[place[id(x)]] if isinstance(x, torch.Tensor) else x for x in leaves], spec
    )
    try:
        with torch._C.DisableTorchFunction(), fake_mode:
            val = overload(*fake_args, **fake_kwargs)
    except Exception as exc:
        return f"the meta kernel of aten.{name} rejects the call ({type(exc).__name__})"
    call = graph.call_function(overload, tuple(args), dict(kwargs))
    call.meta["val"] = val
    if isinstance(val, (tuple, list)):
        items = []
        for i, v in enumerate(val):
            item = graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = v
            items.append(item)
        graph.output(tuple(items))
    else:
        graph.output(call)
    return torch.fx.GraphModule(torch.nn.Module(), graph), tensors


def _fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    """``t`` as a fake tensor of its metadata. NOTE: a view is made by replaying its views on
    its base, which fails for some chains (``view_as_complex`` of a reshaped view, logged as an
    error by PyTorch): a strided tensor of its own stands for a view of another dtype than its
    base's, or one whose replay fails (a functional overload reads no aliasing)."""
    base = t._base
    if base is None or base.dtype == t.dtype:
        try:
            return mode.from_tensor(t)
        except Exception:  # NOTE: a replay refused: the tensor alone, below
            pass
    with torch._C.DisableTorchFunction():
        alone = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return mode.from_tensor(alone)

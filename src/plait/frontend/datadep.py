"""Calls whose output shape depends on tensor values, captured as ``aten_datadep`` nodes.

``nonzero``/``argwhere``, ``masked_select``, ``x[bool_mask]``, ``unique``,
``unique_consecutive``, ``bincount`` and ``repeat_interleave`` with a tensor of repeats: each
becomes one ``aten_datadep`` node (:mod:`plait.ir.ops.datadep`) whose data-dependent dims are
unbacked sizes (``dd0``, ...). Capture records each one's size on the sample
(``cx.unbacked``) only to check the rule against eager; nothing is guarded on it.

What may read a value with an unbacked dim (:func:`consumer_refusal`), each a function of the
operand types alone, whatever the size (0 and 1 included):

- a graph output;
- a pointwise op whose tensor operands all have the result's shape, or are 0-dim (``x * 2``,
  ``.float()``, ``where(m, x, 0.0)`` on one value's shape);
- a reduction of one tensor (``sum``, ``mean``, ``amax``, ``all``, ``softmax``, ...);
- ``permute``, ``transpose``, ``unsqueeze``, ``flatten``, ``detach``, ``contiguous``, and
  ``select`` of a static dim.

Anything else (a broadcast against another shape, a reshape, a read of the size itself, an
opaque call or an ATen trace, another data-dependent op) is refused as ``data-dependent``:
under ``fullgraph=False`` the reported fallback.

Example:
    >>> import torch
    >>> from plait.frontend import capture_program
    >>> prog = capture_program(lambda x: x[x > 0].sum(), (torch.randn(4, 3),))
    >>> [(n.op, str(n.outputs[0].type)) for n in prog.graph.nodes]
    [('gt', 'bool[4, 3]'), ('aten_datadep', 'f32[dd0]'), ('sum', 'f32[]')]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from plait.frontend.call_encoding import NotLiteral, call_spec
from plait.frontend.restart_sizes import flat
from plait.frontend.table import op
from plait.ir import TensorType, Value
from plait.ir.graph import Node
from plait.ir.ops import AttrError, Category, TypeRuleError, get_op
from plait.ir.ops.aten import overload_name
from plait.symbolic import has_unbacked, is_unbacked, unbacked_symbol

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

T = torch.Tensor
aten = torch.ops.aten

_REDUCTIONS = frozenset(
    {"sum", "mean", "amax", "amin", "all", "any", "count_nonzero", "nansum", "prod",
     "logsumexp", "var", "softmax", "log_softmax"}
)  # fmt: skip
_SHAPE_VIEWS = frozenset({"permute", "transpose", "unsqueeze", "flatten", "detach", "contiguous"})
SUPPORTED = (
    "a graph output, a pointwise op on operands of its own shape (or 0-dim ones), a reduction, "
    "permute/transpose/unsqueeze/flatten, or select of a static dim"
)


def unbacked_type(t: Any) -> bool:
    return isinstance(t, TensorType) and has_unbacked(t.shape)


def consumer_refusal(node: Node) -> str | None:
    """Why ``node`` cannot read its operand of data-dependent size, or None when it may (or
    reads none)."""
    operands = [v for v in node.input_values() if isinstance(v.type, TensorType)]
    if not any(unbacked_type(v.type) for v in operands):
        return None
    what = next(str(v.type) for v in operands if unbacked_type(v.type))
    opdef = get_op(node.op)
    out = node.outputs[0].type if node.outputs else None
    if opdef.category is Category.POINTWISE and isinstance(out, TensorType):
        if all(v.type.shape == out.shape or v.type.shape == () for v in operands):  # type: ignore[union-attr]
            return None
        return f"{node.op} broadcasts {what} against another shape"
    if node.op in _REDUCTIONS and len(operands) == 1:
        return None
    if node.op in _SHAPE_VIEWS:
        return None
    if node.op == "select":
        x = node.inputs[0]
        assert isinstance(x, Value) and isinstance(x.type, TensorType)
        dim = int(node.attrs["dim"]) % max(x.type.rank, 1)
        if not is_unbacked(x.type.shape[dim]):
            return None
        return f"select along the data-dependent dim of {what}"
    return f"{node.op} cannot take {what}"


def refuse(cx: CaptureContext, why: str) -> Any:
    cx.fail(
        "data-dependent",
        f"{why}: a size that depends on tensor values (an unbacked size) may only reach "
        f"{SUPPORTED}",
        "reduce the data-dependent result to a static shape (sum, mean, amax, ...) inside the "
        "program, return it, or call the rest outside the compiled function",
    )


def check_new_nodes(cx: CaptureContext, first: int) -> None:
    """Refuse (``data-dependent``) the first node emitted since position ``first`` that reads a
    value of unbacked size it cannot take."""
    for node in cx.builder.graph.nodes[first:]:
        why = consumer_refusal(node)
        if why is not None:
            refuse(cx, why)


def unbacked_operand(cx: CaptureContext, args: Any) -> str | None:
    """The type of the first tensor in ``args`` whose size depends on tensor values."""
    from plait.frontend.capture_values import Tracer
    from plait.frontend.tracer import pytree_leaves

    for x in pytree_leaves(args):
        if isinstance(x, Tracer) and x._cx is cx and (x._value is not None or x._lift is not None):
            t = cx.type_of(x)
            if unbacked_type(t):
                return str(t)
    return None


def emit(cx: CaptureContext, overload: Any, args: tuple, kwargs: dict) -> Any:
    """One ``aten_datadep`` node calling ``overload(*args, **kwargs)`` (tracers as operands):
    its values, one per result of the overload.

    NOTE: the overload also runs on the samples, and every result (those the program does not
    ask for too) must have the node's type, its unbacked sizes aside (a meta kernel that
    disagrees with the kernel is refused, never a node whose type lies)."""
    name, ovl = overload_name(overload)
    inner = unbacked_operand(cx, (args, kwargs))
    if inner is not None:
        refuse(cx, f"aten.{name} of {inner}")
    try:
        tensors, attrs = call_spec(args, kwargs)
    except NotLiteral as exc:
        cx.limitation(f"an argument of aten.{name} has no literal form: {exc}")
    operands = [cx.value(t) for t in tensors]
    first = len(cx.unbacked)
    values = None
    for count in (1, 2, 0):  # NOTE: 0: the meta kernel knows the size (an empty operand)
        sizes = ",".join(str(unbacked_symbol(first + k)) for k in range(count))
        try:
            values = cx.builder.call(
                "aten_datadep", operands, name=name, overload=ovl, sizes=sizes, **attrs
            )
            break
        except (TypeRuleError, AttrError, TypeError, ValueError) as exc:
            error = exc
    if values is None:
        if cx.dynamic:  # NOTE: its operands take static shapes: capture again with them static
            cx._restart_static(operands, f"aten.{name} takes operands of static shape")
        cx.limitation(f"plait's aten_datadep node rejects aten.{name}: {error}")
    found: list[Any] = []
    plain_args, plain_kwargs = cx.unwrap(args, found), cx.unwrap(kwargs, found)
    with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
        sampled = overload(*plain_args, **plain_kwargs)
    outs = list(sampled) if isinstance(sampled, (tuple, list)) else [sampled]
    seen: dict[Any, int] = {}
    if len(values) != len(outs) or not all(_fits(v, o, seen) for v, o in zip(values, outs)):
        got = ", ".join(f"{o.dtype} {tuple(o.shape)}" for o in outs)
        cx.limitation(
            f"the meta kernel of aten.{name} types this call "
            f"{[str(v.type) for v in values]}, its kernel returns {got}"
        )
    for d, n in seen.items():
        cx.unbacked.setdefault(d, n)
    return values


def _fits(v: Value, o: Any, seen: dict[Any, int]) -> bool:
    """Whether result ``o`` has ``v``'s type, binding its unbacked sizes in ``seen``."""
    t = v.type
    if not isinstance(t, TensorType) or not isinstance(o, torch.Tensor):
        return False
    if o.dtype != t.dtype or o.dim() != t.rank or TensorType.of(o).device != t.device:
        return False
    for d, n in zip(t.shape, o.shape):
        if is_unbacked(d):
            if seen.setdefault(d, int(n)) != int(n):
                return False
        elif d != int(n):
            return False
    return True


def _dim(cx: CaptureContext, x: Any, dim: Any) -> int:
    """``dim`` counted from the front (the meta kernels of unique_consecutive and unique_dim
    mistype a negative one)."""
    rank = cx.tracer(x)._plain.dim()
    d = cx.int(dim)
    return d % rank if -rank <= d < rank else d  # NOTE: out of range: the kernel's own error


def _pick(values: list[Value], wanted: list[bool]) -> Any:
    chosen = [v for v, w in zip(values, wanted) if w]
    return chosen[0] if len(chosen) == 1 else tuple(chosen)


@op(torch.nonzero, T.nonzero)
def _nonzero(cx: CaptureContext, out: Any, x: Any, *, as_tuple: bool = False) -> Any:
    rows = emit(cx, aten.nonzero.default, (x,), {})[0]
    if not as_tuple:
        return rows
    return tuple(cx.call("select", rows, dim=1, index=i) for i in range(len(out)))


@op(torch.argwhere, T.argwhere)
def _argwhere(cx: CaptureContext, out: Any, x: Any) -> Any:
    return emit(cx, aten.argwhere.default, (x,), {})[0]


@op(torch.masked_select, T.masked_select)
def _masked_select(cx: CaptureContext, out: Any, x: Any, mask: Any) -> Any:
    return emit(cx, aten.masked_select.default, (x, mask), {})[0]


def masked_index(cx: CaptureContext, out: Any, x: Any, mask: Any) -> Any:
    """``x[mask]`` for one boolean mask (``aten.index.Tensor``)."""
    return emit(cx, aten.index.Tensor, (x, [mask]), {})[0]


def repeat_interleave(
    cx: CaptureContext, out: Any, x: Any, repeats: Any, dim: Any, output_size: Any = None
) -> Any:
    """``repeat_interleave`` with a tensor of repeats (``torch.repeat_interleave(r)`` when
    ``repeats`` is None). With ``output_size`` the size is static (PyTorch checks it)."""
    size = {} if output_size is None else {"output_size": cx.int(output_size)}
    if repeats is None:
        return emit(cx, aten.repeat_interleave.Tensor, (x,), size)[0]
    d = None if dim is None else cx.int(dim)
    return emit(cx, aten.repeat_interleave.self_Tensor, (x, repeats, d), size)[0]


@op(torch.unique, T.unique)
def _unique(
    cx: CaptureContext,
    out: Any,
    x: Any,
    sorted: bool = True,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: Any = None,
) -> Any:
    flags = (bool(sorted), bool(return_inverse), bool(return_counts))
    args: tuple[Any, ...] = (x, *flags)
    call = aten._unique2.default
    if dim is not None:
        call, args = aten.unique_dim.default, (x, _dim(cx, x, dim), *flags)
    wanted = [True, flags[1], flags[2]]
    return _pick(emit(cx, call, args, {}), wanted)


@op(torch.unique_consecutive, T.unique_consecutive)
def _unique_consecutive(
    cx: CaptureContext,
    out: Any,
    x: Any,
    return_inverse: bool = False,
    return_counts: bool = False,
    dim: Any = None,
) -> Any:
    d = None if dim is None else _dim(cx, x, dim)
    if d == 0 and cx.tracer(x)._plain.dim() == 1:
        d = None  # NOTE: what the kernel runs then (its meta kernel mistypes dim=0 there)
    args = (x, bool(return_inverse), bool(return_counts), d)
    wanted = [True, bool(return_inverse), bool(return_counts)]
    return _pick(emit(cx, aten.unique_consecutive.default, args, {}), wanted)


@op(torch.bincount, T.bincount)
def _bincount(cx: CaptureContext, out: Any, x: Any, weights: Any = None, minlength: Any = 0) -> Any:
    return emit(cx, aten.bincount.default, (x, weights, cx.int(minlength)), {})[0]


def refuse_unruled(cx: CaptureContext, args: tuple, kwargs: dict) -> None:
    """A call with no capture rule (an opaque node or an ATen trace, both typed from the
    sample's static shapes) may not read a value of unbacked size."""
    inner = unbacked_operand(cx, (args, kwargs))
    if inner is not None:
        refuse(cx, f"{cx.current} has no capture rule and reads {inner}")


def refuse_operands(cx: CaptureContext, name: str, operands: Any) -> None:
    """An IR op's type rule rejected operands of which one has an unbacked size."""
    for o in flat(operands):
        if isinstance(o, Value) and unbacked_type(o.type):
            refuse(cx, f"{name} cannot take {o.type}")


@op(torch.nonzero_static, T.nonzero_static)
def _nonzero_static(
    cx: CaptureContext, out: Any, x: Any, *, size: Any, fill_value: Any = -1
) -> Any:
    # NOTE: a static size (padded with fill_value or cut): a node with no unbacked size
    args = {"size": cx.int(size), "fill_value": cx.int(fill_value)}
    return emit(cx, aten.nonzero_static.default, (x,), args)[0]

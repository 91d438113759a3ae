"""``aten_datadep``: one ATen overload whose output shape depends on its operands' values.

``nonzero``, ``masked_select``, ``index.Tensor`` with a boolean mask, ``_unique2``,
``unique_dim``, ``unique_consecutive``, ``bincount``, ``repeat_interleave.Tensor``: the size of
a result is known only once the op has run. Such a node's type names that size with an
*unbacked* symbol (``dd0``, ``dd1``, ...; :func:`plait.symbolic.unbacked_symbol`), listed in the
node's ``sizes`` attribute in order of first appearance in its results. The type rule runs the
overload's meta kernel on fake tensors under a shape environment (which gives the sizes it cannot
know as unbacked symbols of its own) and renames them to the node's; so the rule is a function of
the operand types and attributes, and the text round trip is exact.

A call whose sizes the meta kernel knows (``nonzero`` of an empty tensor, ``repeat_interleave``
given its ``output_size``) names none (``sizes=""``): its types are static, and it still runs as
PyTorch's call. Its operands have static shapes (a data-dependent size fed into another such op
is refused by the type rule). The node is run by PyTorch (Stax calls the overload; the
interpreter runs the reference implementation) and binds its symbols to the sizes it returns.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 3), torch.float32))
    >>> (rows,) = gb.call("aten_datadep", [x], name="nonzero", sizes="dd0")
    >>> str(rows.type)
    'i64[dd0, 2]'
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

import sympy
import torch

from plait.ir.ops.aten import (
    _check_spec,
    _results,
    defined_results,
    meta_rejects,
)
from plait.ir.ops.aten_overloads import resolve_overload
from plait.ir.ops.call_literals import decode_call
from plait.ir.ops.extern import ALL
from plait.ir.ops.registry import VARIADIC, Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.ops.vjp import torch_vjp_rule, vjp
from plait.ir.types import TensorType, Type
from plait.symbolic import UNBACKED_RE, symbol


def size_names(sizes: str) -> list[str]:
    """The unbacked symbol names a ``sizes`` attribute lists (``"dd0,dd1"``)."""
    names = [s.strip() for s in sizes.split(",")] if sizes.strip() else []
    for n in names:
        if not UNBACKED_RE.match(n):
            raise TypeRuleError(f"aten_datadep: {n!r} is not an unbacked size name (dd0, dd1, ...)")
    if len(set(names)) != len(names):
        raise TypeRuleError(f"aten_datadep: sizes {sizes!r} names a size twice")
    return names


# NOTE: the shape environment logs each unbacked size it makes (at DEBUG): a handler that runs
# then, inside a capture, would be read as Python state of the user's program.
_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch.__trace")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was


@functools.lru_cache(maxsize=1024)
def _meta_types(
    name: str,
    overload: str,
    literals: str,
    kwliterals: str,
    sizes: str,
    operands: tuple[TensorType, ...],
) -> tuple[TensorType, ...]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    op = resolve_overload(name, overload)
    what = f"aten.{name}.{overload}"
    names = size_names(sizes)
    for t in operands:
        if not t.is_static:
            raise TypeRuleError(
                f"aten_datadep: {what} has an operand of symbolic shape {t}; a data-dependent op "
                "takes operands of static shape"
            )
    try:
        with _quiet(), torch._C.DisableTorchFunction(), FakeTensorMode(shape_env=ShapeEnv()):
            fakes = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in operands]
            args, kwargs = decode_call(fakes, literals, kwliterals)
            outs = _results(op(*args, **kwargs), what)
            raw = [
                ([d.node.expr if isinstance(d, torch.SymInt) else int(d) for d in o.shape],
                 o.dtype, str(o.device))
                for o in outs
            ]  # fmt: skip
    except TypeRuleError:
        raise
    except Exception as exc:  # NOTE: the meta kernel's own error: bad shapes, dtypes, arguments
        raise meta_rejects("aten_datadep", what, exc) from None
    found: list[sympy.Symbol] = []
    for shape, _, _ in raw:
        for d in shape:
            if isinstance(d, sympy.Expr):
                if not d.is_Symbol:
                    raise TypeRuleError(f"aten_datadep: {what} has an output dim {d}")
                if d not in found:
                    found.append(d)
    if len(found) != len(names):
        raise TypeRuleError(
            f"aten_datadep: {what} makes {len(found)} data-dependent size(s); the node names "
            f"{len(names)} ({sizes!r})"
        )
    rename = {s: symbol(n) for s, n in zip(found, names)}
    return tuple(
        TensorType(tuple(rename[d] if isinstance(d, sympy.Expr) else d for d in shape), dt, dev)
        for shape, dt, dev in raw
    )


def _rule(
    args: list[Type], name: str, overload: str, literals: str, kwliterals: str, sizes: str
) -> list[Type]:
    _check_spec(args, literals, kwliterals)
    operands = tuple(t for t in args if isinstance(t, TensorType))
    return list(_meta_types(name, overload, literals, kwliterals, sizes, operands))


def _ref(
    args: list[Any], name: str, overload: str, literals: str, kwliterals: str, sizes: str
) -> Any:
    call_args, keywords = decode_call(list(args), literals, kwliterals)
    return defined_results(resolve_overload(name, overload)(*call_args, **keywords))


register(
    OpDef(
        "aten_datadep",
        Category.EXTERN,
        (Param("args", VARIADIC),),
        (
            Attr("name", "str"),
            Attr("overload", "str", "default"),
            Attr("literals", "str", ""),
            Attr("kwliterals", "str", ""),
            Attr("sizes", "str", ""),
        ),
        _rule,
        _ref,
        ALL,
        "an ATen overload whose output shape depends on the values (nonzero, unique), run by "
        "PyTorch; its data-dependent dims are unbacked sizes (dd0, ...)",
        fixed_outputs=None,
    )
)


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: a data-dependent result can carry a gradient (``masked_select`` and ``index.Tensor``
# with a boolean mask select float values): PyTorch's autograd over the overload, which runs it
# again in the backward (no such overload draws random numbers). Integer results (``nonzero``)
# carry none; an overload eager cannot differentiate (``_unique2``) fails as eager's backward.
vjp("aten_datadep")(torch_vjp_rule)

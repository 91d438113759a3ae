"""Rules for calls composed of view rules: the ``*_copy`` variants of views, ``ravel``, the
stacking and splitting helpers (hstack, vstack, dstack, column_stack, tensor_split, hsplit,
vsplit, dsplit) and the functional scatters into a view (slice_scatter, select_scatter,
diagonal_scatter).

NOTE: a ``*_copy`` call computes what its view computes into new memory: the view rule's value
without its view steps (a fresh root). A functional scatter is the write-back of a write through
the view (views.py), applied to a value: no memory is shared with its input.
"""

from __future__ import annotations

from typing import Any

import torch

from plait.frontend.lower_common import both
from plait.frontend.lower_movement import _atleast
from plait.frontend.lower_shape import _pieces, _type, reshaped, split_args
from plait.frontend.table import NoIROp, Viewed, lookup, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep, put_diagonal
from plait.ir import Value

T = torch.Tensor

# NOTE: the copy variant -> the view call whose rule computes its value (same signature).
_COPIES = {
    "diagonal_copy": torch.diagonal,
    "permute_copy": torch.permute,
    "squeeze_copy": torch.squeeze,
    "unsqueeze_copy": torch.unsqueeze,
    "transpose_copy": torch.transpose,
    "t_copy": torch.t,
    "expand_copy": T.expand,
    "unfold_copy": T.unfold,
    "view_copy": T.view,
    "select_copy": torch.select,
    "split_copy": torch.split,
    "split_with_sizes_copy": torch.split_with_sizes,
    "unbind_copy": torch.unbind,
    "alias_copy": None,
}


def _fresh(result: Any) -> Any:
    """A view rule's result as fresh values (no aliasing)."""
    if isinstance(result, Viewed):
        return result.value
    if isinstance(result, (tuple, list)):
        return type(result)(_fresh(r) for r in result)
    return result


def _copy_rule(view_call: Any) -> Any:
    def emit(cx: CaptureContext, out: Any, *args: Any, **kwargs: Any) -> Any:
        if view_call is None:  # NOTE: alias_copy: the same values
            return cx.value(args[0])
        rule = lookup(view_call)
        assert rule is not None and rule.fn is not None, view_call
        return _fresh(rule.fn(cx, out, *args, **kwargs))

    return emit


for _name, _view_call in _COPIES.items():
    if hasattr(torch, _name):
        op(getattr(torch, _name))(_copy_rule(_view_call))


@op(*both("ravel"))
def _ravel(cx: CaptureContext, out: Any, x: Any) -> Any:
    # NOTE: like reshape: a view where eager can make one (the IR value is the same).
    return reshaped(cx, x, ViewStep.of("reshape", shape=(-1,)))


# --- stacking --------------------------------------------------------------------------------
def _tensors(tensors: Any) -> list[Any]:
    return list(tensors)


def _cat_of(cx: CaptureContext, values: list[Value], dim: int) -> Value:
    out: Value = cx.call("cat", values, dim=dim)
    return out


@op(*both("hstack"))
def _hstack(cx: CaptureContext, out: Any, tensors: Any) -> Value:
    values = [_atleast(cx, t, 1).value for t in _tensors(tensors)]
    return _cat_of(cx, values, 0 if _type(values[0]).rank == 1 else 1)


@op(*both("vstack", "row_stack"))
def _vstack(cx: CaptureContext, out: Any, tensors: Any) -> Value:
    return _cat_of(cx, [_atleast(cx, t, 2).value for t in _tensors(tensors)], 0)


@op(*both("dstack"))
def _dstack(cx: CaptureContext, out: Any, tensors: Any) -> Value:
    return _cat_of(cx, [_atleast(cx, t, 3).value for t in _tensors(tensors)], 2)


@op(*both("column_stack"))
def _column_stack(cx: CaptureContext, out: Any, tensors: Any) -> Value:
    values = []
    for t in _tensors(tensors):
        v = cx.value(t)
        if _type(v).rank <= 1:
            v = cx.call("reshape", v, shape=(-1, 1))
        values.append(v)
    return _cat_of(cx, values, 1)


# --- splitting ---------------------------------------------------------------------------------
def _split_views(cx: CaptureContext, out: Any, x: Any, dim: int, what: Any) -> Any:
    """Views of consecutive pieces along ``dim``; the piece sizes are eager's results'."""
    if isinstance(what, T):
        cx.fail("data-dependent", "split points given as a tensor read its values")
    split_args(cx, what)
    d = dim % max(_type(cx.value(x)).rank, 1)
    sizes = [int(o.shape[d]) for o in out]
    values = cx.call("split", cx.value(x), sizes=tuple(sizes), dim=d)
    return _pieces(cx, x, tuple(values), sizes, d)


@op(*both("tensor_split"))
def _tensor_split(
    cx: CaptureContext, out: Any, x: Any, indices_or_sections: Any = None, dim: Any = 0, **kw: Any
) -> Any:
    what = kw.get("sections", kw.get("indices", kw.get("tensor_indices_or_sections")))
    return _split_views(cx, out, x, cx.int(dim), indices_or_sections if what is None else what)


@op(*both("hsplit"))
def _hsplit(cx: CaptureContext, out: Any, x: Any, sections: Any) -> Any:
    return _split_views(cx, out, x, 1 if _type(cx.value(x)).rank > 1 else 0, sections)


op(*both("vsplit"))(lambda cx, out, x, sections: _split_views(cx, out, x, 0, sections))
op(*both("dsplit"))(lambda cx, out, x, sections: _split_views(cx, out, x, 2, sections))


# --- functional scatters -------------------------------------------------------------------------
def _same_dtype(cx: CaptureContext, base: Value, src: Any) -> Value:
    v = cx.value(src)
    if _type(v).dtype != _type(base).dtype:
        raise NoIROp("a scatter of another dtype than its input's")
    return v


@op(*both("slice_scatter"))
def _slice_scatter(
    cx: CaptureContext,
    out: Any,
    x: Any,
    src: Any,
    dim: Any = 0,
    start: Any = None,
    end: Any = None,
    step: Any = 1,
) -> Value:
    base = cx.value(x)
    bound = [None if b is None else cx.int(b) for b in (start, end)]
    piece = ViewStep.of("slice", dim=cx.int(dim), start=bound[0], end=bound[1], step=cx.int(step))
    return piece.unapply(cx, base, _same_dtype(cx, base, src))


@op(*both("select_scatter"))
def _select_scatter(cx: CaptureContext, out: Any, x: Any, src: Any, dim: Any, index: Any) -> Value:
    base = cx.value(x)
    step = ViewStep.of("select", dim=cx.int(dim), index=cx.int(index))
    return step.unapply(cx, base, _same_dtype(cx, base, src))


@op(*both("diagonal_scatter"))
def _diagonal_scatter(
    cx: CaptureContext, out: Any, x: Any, src: Any, offset: Any = 0, dim1: Any = 0, dim2: Any = 1
) -> Value:
    base = cx.value(x)
    new = _same_dtype(cx, base, src)
    return put_diagonal(cx, base, new, cx.int(offset), cx.int(dim1), cx.int(dim2))

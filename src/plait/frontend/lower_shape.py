"""Rules for views, reshapes, indexing, concatenation, writes into tensors, and factories.

NOTE: every rule whose PyTorch result is a view returns :class:`Viewed` with the view steps, so
later in-place updates through it (or of its base) are functionalized (views.py). A factory's
dtype and device are taken from PyTorch's own result, so defaults are eager's by construction.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from plait.errors import ProgramIndexError, ProgramValueError
from plait.frontend import datadep, stride_choices
from plait.frontend.index_tensors import count, gather_adjacent, listed
from plait.frontend.lower_common import both
from plait.frontend.symints import TracedInt, plain_int
from plait.frontend.table import InPlace, NoIROp, Viewed, getter, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep, scatter
from plait.ir import TensorType, Value
from plait.symbolic import normalize

T = torch.Tensor


def _type(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType)
    return v.type


def _view(cx: CaptureContext, x: Any, *steps: ViewStep) -> Viewed:
    v = cx.value(x)
    for s in steps:
        v = s.apply(cx, v)
    return Viewed(v, x, steps)


def _shape_args(cx: CaptureContext, args: tuple) -> tuple[Any, ...]:
    """``f(2, 3)``, ``f((2, 3))`` and ``f(torch.Size([2, 3]))`` all name shape (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = tuple(args[0])
    return tuple(cx.dim(d) for d in args)


def _dims_of(cx: CaptureContext, x: Any) -> tuple[Any, ...]:
    return _type(cx.value(x)).shape


# --- view ops --------------------------------------------------------------------------------
def _checked_view(cx: CaptureContext, x: Any, shape: tuple[Any, ...]) -> Viewed:
    viewed = _view(cx, x, ViewStep.of("view", shape=shape))
    stride_choices.guard_view(cx, x, viewed.value)
    return viewed


def reshaped(cx: CaptureContext, x: Any, step: ViewStep) -> Viewed:
    """A reshape-like ``step`` of ``x``: eager's view or copy, chosen by the strides."""
    viewed = _view(cx, x, step)
    if stride_choices.depends_on_strides(cx, x, "reshape", viewed.value):
        return Viewed(viewed.value, x, viewed.steps, by_strides=True)
    return viewed


@op(T.view)
def _view_op(cx: CaptureContext, out: Any, x: Any, *shape: Any, **kwargs: Any) -> Any:
    if "dtype" in kwargs or (shape and isinstance(shape[0], torch.dtype)):
        cx.limitation("Tensor.view(dtype) reinterprets bits; no IR op")
    if "size" in kwargs:
        shape = (kwargs["size"],)
    return _checked_view(cx, x, _shape_args(cx, shape))


@op(*both("reshape"))
def _reshape(cx: CaptureContext, out: Any, x: Any, *shape: Any, **kwargs: Any) -> Any:
    if "shape" in kwargs:
        shape = (kwargs["shape"],)
    return reshaped(cx, x, ViewStep.of("reshape", shape=_shape_args(cx, shape)))


op(T.view_as)(lambda cx, out, x, other: _checked_view(cx, x, _dims_of(cx, other)))
op(T.reshape_as)(
    lambda cx, out, x, other: reshaped(cx, x, ViewStep.of("reshape", shape=_dims_of(cx, other)))
)
op(T.expand_as)(
    lambda cx, out, x, other: _view(cx, x, ViewStep.of("expand", shape=_dims_of(cx, other)))
)


@op(T.expand)
def _expand(cx: CaptureContext, out: Any, x: Any, *sizes: Any, **kwargs: Any) -> Any:
    if "size" in kwargs:
        sizes = (kwargs["size"],)
    return _view(cx, x, ViewStep.of("expand", shape=_shape_args(cx, sizes)))


@op(*both("permute"))
def _permute(cx: CaptureContext, out: Any, x: Any, *dims: Any, **kwargs: Any) -> Any:
    if "dims" in kwargs:
        dims = (kwargs["dims"],)
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = tuple(dims[0])
    return _view(cx, x, ViewStep.of("permute", dims=tuple(cx.int(d) for d in dims)))


@op(*both("transpose", "swapaxes", "swapdims"))
def _transpose(cx: CaptureContext, out: Any, x: Any, dim0: Any, dim1: Any) -> Any:
    return _view(cx, x, ViewStep.of("transpose", dim0=cx.int(dim0), dim1=cx.int(dim1)))


def _t(cx: CaptureContext, out: Any, x: Any) -> Any:
    rank = out.dim()
    if rank < 2:
        return _view(cx, x, ViewStep("identity"))
    if rank == 2:
        return _view(cx, x, ViewStep.of("transpose", dim0=0, dim1=1))
    return _view(cx, x, ViewStep.of("permute", dims=tuple(range(rank - 1, -1, -1))))


op(*both("t"), getter("T"))(_t)
op(getter("mT"))(lambda cx, out, x: _view(cx, x, ViewStep.of("transpose", dim0=-2, dim1=-1)))


@op(*both("unsqueeze"))
def _unsqueeze(cx: CaptureContext, out: Any, x: Any, dim: Any) -> Any:
    return _view(cx, x, ViewStep.of("unsqueeze", dim=cx.int(dim)))


@op(*both("squeeze"))
def _squeeze(cx: CaptureContext, out: Any, x: Any, dim: Any = None) -> Any:
    dims = (
        None
        if dim is None
        else (tuple(cx.int(d) for d in dim) if isinstance(dim, (list, tuple)) else (cx.int(dim),))
    )
    return _view(cx, x, ViewStep.of("squeeze", dims=dims))


@op(*both("flatten"))
def _flatten(cx: CaptureContext, out: Any, x: Any, start_dim: Any = 0, end_dim: Any = -1) -> Any:
    return reshaped(
        cx, x, ViewStep.of("flatten", start_dim=cx.int(start_dim), end_dim=cx.int(end_dim))
    )


@op(*both("unflatten"))
def _unflatten(cx: CaptureContext, out: Any, x: Any, dim: Any, sizes: Any) -> Any:
    shape = list(_dims_of(cx, x))
    d = cx.int(dim) % len(shape)
    shape[d : d + 1] = [cx.dim(s) for s in sizes]
    return _view(cx, x, ViewStep.of("view", shape=tuple(shape)))


@op(*both("contiguous"))
def _contiguous(cx: CaptureContext, out: Any, x: Any, memory_format: Any = None) -> Any:
    # NOTE: contiguous() of a contiguous tensor returns the tensor itself: an identity alias.
    v: Value = cx.call("contiguous", cx.value(x))
    by_strides = stride_choices.depends_on_strides(cx, x, "contiguous", v)
    return Viewed(v, x, (ViewStep("identity"),), by_strides)


@op(*both("detach"), getter("data"), grad=False)
def _detach(cx: CaptureContext, out: Any, x: Any) -> Any:
    # NOTE: shares memory with x (a write through it writes x) and never requires grad.
    return _view(cx, x, ViewStep("detach"))


@op(*both("clone"))
def _clone(cx: CaptureContext, out: Any, x: Any, memory_format: Any = None) -> Value:
    return cx.value(x)  # NOTE: same value, new memory: the result is a fresh root


@op(*both("select"))
def _select(cx: CaptureContext, out: Any, x: Any, dim: Any, index: Any) -> Any:
    return _view(cx, x, ViewStep.of("select", dim=cx.int(dim), index=cx.int(index)))


@op(*both("narrow"))
def _narrow(cx: CaptureContext, out: Any, x: Any, dim: Any, start: Any, length: Any) -> Any:
    d = cx.int(dim)
    s = _bound(cx, start)
    if isinstance(s, int) and s < 0:
        s = normalize(_dims_of(cx, x)[d] + s)
    end = normalize(s + _bound(cx, length))
    return _view(cx, x, ViewStep.of("slice", dim=d, start=s, end=end, step=1))


def _bound(cx: CaptureContext, b: Any) -> Any:
    """A slice bound for the IR: an int, or with ``dynamic=True`` the size expression of a
    traced size (slices.py guards it); a negative traced size is specialized."""
    if isinstance(b, TracedInt) and not isinstance(b.ir, int) and plain_int(b) >= 0:
        return b.ir
    return cx.int(b)


# --- split / chunk / unbind ------------------------------------------------------------------
def _pieces(
    cx: CaptureContext, x: Any, values: tuple[Value, ...], sizes: list[int], dim: int
) -> tuple[Viewed, ...]:
    out: list[Viewed] = []
    start = 0
    for v, n in zip(values, sizes):
        out.append(
            Viewed(v, x, (ViewStep.of("slice", dim=dim, start=start, end=start + n, step=1),))
        )
        start += n
    return tuple(out)


def split_args(cx: CaptureContext, what: Any) -> None:
    """Specialize each traced size among a split's sizes, sections or indices: the pieces' sizes
    are read from eager's results, so a size the program passed (``y.shape[0]``) must be guarded,
    never kept symbolic while the pieces are fixed at the capture sample's sizes."""
    if isinstance(what, (list, tuple)):
        for w in what:
            split_args(cx, w)
    elif isinstance(what, TracedInt):
        cx.int(what)


@op(*both("split"))
def _split(cx: CaptureContext, out: Any, x: Any, split_size_or_sections: Any, dim: Any = 0) -> Any:
    d = cx.int(dim)
    split_args(cx, split_size_or_sections)
    sizes = [int(o.shape[d]) for o in out]
    values = cx.call("split", cx.value(x), sizes=tuple(sizes), dim=d)
    return _pieces(cx, x, values, sizes, d)


@op(*both("split_with_sizes"))
def _split_with_sizes(cx: CaptureContext, out: Any, x: Any, split_sizes: Any, dim: Any = 0) -> Any:
    return _split(cx, out, x, split_sizes, dim)


@op(*both("chunk"))
def _chunk(cx: CaptureContext, out: Any, x: Any, chunks: Any, dim: Any = 0) -> Any:
    d = cx.int(dim)
    values = cx.call("chunk", cx.value(x), chunks=cx.int(chunks), dim=d)
    return _pieces(cx, x, values, [int(o.shape[d]) for o in out], d)


def _count_static(cx: CaptureContext, x: Any, dim: int, count: int) -> None:
    """``unbind`` and iteration make one result per index of ``dim``: a symbolic size there is
    specialized (a guard that the count is the captured one), never a fixed count of results."""
    size = _dims_of(cx, x)[dim]
    if not isinstance(size, int):
        cx.specialize(size, count)


@op(*both("unbind"))
def _unbind(cx: CaptureContext, out: Any, x: Any, dim: Any = 0) -> Any:
    d = cx.int(dim)
    _count_static(cx, x, d, len(out))
    return tuple(_view(cx, x, ViewStep.of("select", dim=d, index=i)) for i in range(len(out)))


@op(T.__iter__)
def _iter(cx: CaptureContext, out: Any, x: Any) -> Any:
    items = list(out)
    if items:
        _count_static(cx, x, 0, len(items))
    views = tuple(_view(cx, x, ViewStep.of("select", dim=0, index=i)) for i in range(len(items)))
    return _Iter(cx.wrap(views, tuple(items), [cx.tracer(x)], cx.tracer(x)._rg))


class _Iter:
    """What ``iter(tensor)`` returns during capture: an iterator over traced rows."""

    def __init__(self, items: Any) -> None:
        self._it = iter(items)

    def __iter__(self) -> _Iter:
        return self

    def __next__(self) -> Any:
        return next(self._it)


@op(*both("cat", "concat", "concatenate"))
def _cat(cx: CaptureContext, out: Any, tensors: Any, dim: Any = 0) -> Value:
    v: Value = cx.call("cat", [cx.value(t) for t in tensors], dim=cx.int(dim))
    return v


@op(*both("stack"))
def _stack(cx: CaptureContext, out: Any, tensors: Any, dim: Any = 0) -> Value:
    v: Value = cx.call("stack", [cx.value(t) for t in tensors], dim=cx.int(dim))
    return v


# --- indexing ----------------------------------------------------------------------------------
def _index_items(cx: CaptureContext, x: Any, index: Any) -> list[Any]:
    """The index as a list with its ellipsis expanded. NOTE: identity tests only: ``==`` on a
    traced index tensor would be a traced call."""
    items = list(index) if isinstance(index, tuple) else [index]
    rank = cx.tracer(x)._plain.dim()
    used = 0
    for it in items:
        if isinstance(it, T):
            p = cx.tracer(it)._plain
            used += p.dim() if p.dtype in (torch.bool, torch.uint8) else 1
        elif it is not None and it is not Ellipsis and not isinstance(it, bool):
            used += 1
    at = [i for i, it in enumerate(items) if it is Ellipsis]
    if len(at) > 1:
        raise ProgramIndexError("an index can only have a single ellipsis ('...')")
    if at:
        items[at[0] : at[0] + 1] = [slice(None)] * max(rank - used, 0)
    return items


def _basic_steps(cx: CaptureContext, x: Any, index: Any) -> tuple[list[ViewStep], Any]:
    """View steps for the basic part of ``x[index]``; returns (steps, advanced) where advanced
    is None or (dim, index tensor) for a single integer-tensor index (applied after the steps).
    """
    steps: list[ViewStep] = []
    advanced: Any = None
    d = 0
    for it in _index_items(cx, x, index):
        if it is None:
            steps.append(ViewStep.of("unsqueeze", dim=d))
            d += 1
        elif isinstance(it, bool):
            cx.limitation("indexing with a Python bool")
        elif isinstance(it, T):
            p = cx.tracer(it)._plain
            if p.dtype in (torch.bool, torch.uint8):
                cx.fail(
                    "data-dependent",
                    "indexing with a boolean mask: the result's shape depends on the mask's values",
                )
            if p.dim() == 0:
                cx.fail(
                    "data-dependent",
                    "indexing with a 0-dim tensor reads its value as a Python index",
                )
            if advanced is None:
                advanced = (d, it)
            elif isinstance(advanced[1], tuple) or advanced[0] + count(advanced[1]) != d:
                raise NoIROp("indexing with index tensors that are not adjacent has no IR op")
            else:
                advanced = (advanced[0], [*listed(advanced[1]), it])
            d += 1
        elif isinstance(it, slice):
            if it.step is not None and cx.int(it.step) <= 0:
                raise ProgramValueError("step must be greater than zero")
            if not (it.start is None and it.stop is None and it.step in (None, 1)):
                steps.append(
                    ViewStep.of(
                        "slice",
                        dim=d,
                        start=None if it.start is None else _bound(cx, it.start),
                        end=None if it.stop is None else _bound(cx, it.stop),
                        step=1 if it.step is None else cx.int(it.step),
                    )
                )
            d += 1
        elif isinstance(it, (list, tuple)):
            if not it or any(type(k) is not int for k in it):
                cx.limitation("indexing with a Python list (an implicit index tensor)")
            if advanced is not None:
                raise NoIROp("indexing with more than one index tensor has no IR op")
            advanced = (d, tuple(it))  # NOTE: constant positions, as a flat list of ints
            d += 1
        else:
            steps.append(ViewStep.of("select", dim=d, index=cx.int(it)))
    return steps, advanced


def _gather(cx: CaptureContext, v: Value, dim: int, index: Any) -> Value:
    """``v`` indexed along ``dim`` by an integer tensor, or a flat tuple of ints (a Python
    list index: eager's implicit index tensor; the sampled call checked their range);
    negative entries wrap, like eager. A copy, never a view, as eager's. Several tensors (a
    list) index adjacent dims together (:func:`~plait.frontend.index_tensors.gather_adjacent`)."""
    if isinstance(index, list):
        return gather_adjacent(cx, v, dim, index)
    n = _type(v).shape[dim]
    if not isinstance(n, int):
        cx.limitation("an index tensor on a symbolic dim")
    if isinstance(index, tuple):
        rows = [
            ViewStep.of("slice", dim=dim, start=k % n, end=k % n + 1, step=1).apply(cx, v)
            for k in index
        ]
        picked: Value = cx.call("cat", rows, dim=dim)
        return picked
    idx = cx.value(index)
    wrapped = cx.call("where", cx.call("lt", idx, 0), cx.call("add", idx, n), idx)
    flat = wrapped if _type(idx).rank == 1 else cx.call("reshape", wrapped, shape=(-1,))
    picked = cx.call("index_select", v, flat, dim=dim)
    if _type(idx).rank == 1:
        out: Value = picked
        return out
    shape = list(_type(v).shape)
    shape[dim : dim + 1] = list(_type(idx).shape)
    out = cx.call("reshape", picked, shape=tuple(shape))
    return out


@op(T.__getitem__)
def _getitem(cx: CaptureContext, out: Any, x: Any, index: Any) -> Any:
    if isinstance(index, T) and cx.tracer(index)._plain.dtype == torch.bool:
        return datadep.masked_index(cx, out, x, index)  # NOTE: its size depends on the mask
    steps, advanced = _basic_steps(cx, x, index)
    if advanced is None:
        return _view(cx, x, *steps)
    v = cx.value(x)
    for s in steps:
        v = s.apply(cx, v)
    return _gather(cx, v, advanced[0], advanced[1])


@op(T.__setitem__)
def _setitem(cx: CaptureContext, out: Any, x: Any, index: Any, value: Any) -> Any:
    base = cx.value(x)
    if isinstance(index, T) and cx.tracer(index)._plain.dtype == torch.bool:
        if tuple(index.shape) != tuple(cx.tracer(x)._plain.shape):
            cx.fail("data-dependent", "assigning through a boolean mask of another shape")
        return InPlace(x, _masked_write(cx, base, index, value))
    steps, advanced = _basic_steps(cx, x, index)
    if advanced is not None:
        cx.limitation("assigning through an index tensor has no IR op")
    view = base
    for s in steps:
        view = s.apply(cx, view)
    return InPlace(x, scatter(cx, base, steps, _fill_like(cx, view, value)))


def _masked_write(cx: CaptureContext, base: Value, mask: Any, value: Any) -> Value:
    ty = _type(base)
    if isinstance(value, T):
        fill: Any = cx.value(value)
        if _type(fill).rank:
            cx.limitation("assigning a tensor through a boolean mask")
        if _type(fill).dtype != ty.dtype:
            fill = cx.call("to_dtype", fill, dtype=ty.dtype)
    else:
        fill = _scalar_for(cx, value, ty.dtype)
    v: Value = cx.call("where", cx.value(mask), fill, base)
    if _type(v).dtype != ty.dtype:
        v = cx.call("to_dtype", v, dtype=ty.dtype)
    return v


def _scalar_for(cx: CaptureContext, value: Any, dtype: torch.dtype) -> Any:
    s = cx.operand(value)
    if isinstance(s, sympy.Expr):
        # NOTE: a symbolic size (an integer) stays a size expression, converted to ``dtype`` by
        # the kernel at each call as eager converts the int: ``bool`` of an expression is always
        # True (a bool fill of ``n - 2`` at n = 2 is False) and ``int`` of one raises
        return s
    if dtype == torch.bool:
        return bool(s)
    return s if dtype.is_floating_point else int(s)


def _fill_like(cx: CaptureContext, target: Value, value: Any) -> Value:
    """``value`` converted to ``target``'s dtype and broadcast to its shape (``copy_``)."""
    ty = _type(target)
    if not isinstance(value, T):
        v: Value = cx.call(
            "full",
            shape=ty.shape,
            dtype=ty.dtype,
            device=ty.device,
            value=_scalar_for(cx, value, ty.dtype),
        )
        return v
    v = cx.value(value)
    if _type(v).device != ty.device:
        cx.limitation("copying between devices inside the program has no IR op")
    if _type(v).dtype != ty.dtype:
        v = cx.call("to_dtype", v, dtype=ty.dtype)
    if _type(v).shape != ty.shape:
        v = cx.call("expand", v, shape=ty.shape)
    return v


op(T.copy_, inplace=True)(
    lambda cx, out, x, src, non_blocking=False: _fill_like(cx, cx.value(x), src)
)
op(T.fill_, inplace=True)(lambda cx, out, x, value: _fill_like(cx, cx.value(x), value))
op(T.zero_, inplace=True)(lambda cx, out, x: _fill_like(cx, cx.value(x), 0))


# --- factories ---------------------------------------------------------------------------------
def _factory(
    cx: CaptureContext, out: Any, shape: tuple[Any, ...], kind: str, value: Any = None
) -> Value:
    dev = str(TensorType.of(out).device)
    if kind == "full":
        v: Value = cx.call(
            "full",
            shape=shape,
            dtype=out.dtype,
            device=dev,
            value=_scalar_for(cx, value, out.dtype),
        )
    else:
        v = cx.call(kind, shape=shape, dtype=out.dtype, device=dev)
    return v


def _sizes(cx: CaptureContext, args: tuple, kwargs: dict) -> tuple[Any, ...]:
    if "size" in kwargs:
        args = (kwargs["size"],)
    return _shape_args(cx, args)


op(torch.zeros, torch.empty)(
    lambda cx, out, *size, **kw: _factory(cx, out, _sizes(cx, size, kw), "zeros")
)
op(torch.ones)(lambda cx, out, *size, **kw: _factory(cx, out, _sizes(cx, size, kw), "ones"))
op(torch.full)(
    lambda cx, out, size, fill_value, **kw: _factory(
        cx, out, _shape_args(cx, (size,)), "full", fill_value
    )
)
op(torch.zeros_like, torch.empty_like)(
    lambda cx, out, x, **kw: _factory(cx, out, _dims_of(cx, x), "zeros")
)
op(torch.ones_like)(lambda cx, out, x, **kw: _factory(cx, out, _dims_of(cx, x), "ones"))
op(torch.full_like)(
    lambda cx, out, x, fill_value, **kw: _factory(cx, out, _dims_of(cx, x), "full", fill_value)
)
op(T.new_zeros, T.new_empty)(
    lambda cx, out, x, *size, **kw: _factory(cx, out, _sizes(cx, size, kw), "zeros")
)
op(T.new_ones)(lambda cx, out, x, *size, **kw: _factory(cx, out, _sizes(cx, size, kw), "ones"))
op(T.new_full)(
    lambda cx, out, x, size, fill_value, **kw: _factory(
        cx, out, _shape_args(cx, (size,)), "full", fill_value
    )
)


@op(torch.arange)
def _arange(cx: CaptureContext, out: Any, *args: Any, **kwargs: Any) -> Value:
    nums = [a for a in args if not isinstance(a, (torch.dtype, torch.device, str))]
    for key in ("start", "end", "step"):
        if key in kwargs:
            nums.append(kwargs[key])
    # NOTE: a size the program read stays symbolic (``arange(0, t)`` of a sequence length): the
    # IR's arange takes a size expression for its bounds (the type rule decides which)
    vals = [cx.dim(a) if isinstance(a, TracedInt) else cx.operand(a) for a in nums]
    start, end, step = (
        (0, vals[0], 1)
        if len(vals) == 1
        else ((vals[0], vals[1], 1) if len(vals) == 2 else tuple(vals[:3]))
    )
    dev = str(TensorType.of(out).device)
    v: Value = cx.call("arange", start=start, end=end, step=step, dtype=out.dtype, device=dev)
    return v


@op(torch.tensor, torch.as_tensor, torch.scalar_tensor, T.new_tensor)
def _tensor(cx: CaptureContext, out: Any, *args: Any, **kwargs: Any) -> Value:
    # NOTE: a constant made by the program on every call: a const input, never written back.
    _check_data(cx, args[0] if args else kwargs.get("data"))
    data = out.detach().clone()
    lifted = cx.lift_input(
        data,
        kind="const",
        name=cx.const_name(),
        ref=data,
        writeback=False,
        requires_grad=False,
    )
    return cx.value(lifted)


def _check_data(cx: CaptureContext, data: Any) -> None:
    """Sizes inside the data are specialized; tensors inside it are read."""
    if isinstance(data, T):
        cx.fail("data-dependent", "torch.tensor(tensor) copies the values of a traced tensor")
    if isinstance(data, TracedInt):
        cx.int(data)
    if isinstance(data, (list, tuple)):
        for d in data:
            _check_data(cx, d)

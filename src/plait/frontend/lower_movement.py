"""Rules for data-movement calls: padding, roll, flip, rot90, repeat/tile, repeat_interleave,
diagonal, diag, diag_embed, unfold, movedim, broadcast_to, atleast_*d, the .H/.mH adjoints of
real tensors, conj/resolve_conj/resolve_neg/conj_physical/real of real tensors (the tensor
itself), gather/take_along_dim/take and adaptive_avg_pool1d.

NOTE: a call that returns a view in eager (diagonal, unfold, movedim, broadcast_to, atleast_*d,
mH/H/adjoint) returns :class:`Viewed`, so writes through it and updates of its base are
functionalized (views.py); the others return fresh values. Compositions of existing IR ops
(repeat as reshape + expand + reshape, rot90 as flip + transpose) move data exactly like the
eager call, so results are bitwise equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.nn.functional as F

from plait.errors import ProgramValueError
from plait.frontend import datadep
from plait.frontend.call_encoding import call_spec
from plait.frontend.lower_common import both
from plait.frontend.lower_nn import adaptive_output_size
from plait.frontend.lower_shape import _scalar_for, _type, _view
from plait.frontend.table import NoIROp, Viewed, getter, op
from plait.frontend.tracer import CaptureContext
from plait.frontend.views import ViewStep, put_diagonal
from plait.ir import Value
from plait.ir.ops.movement import PAD_MODES, padded_dims

T = torch.Tensor


def _ints(cx: CaptureContext, xs: Any) -> tuple[int, ...]:
    """An int or a sequence of ints (or ``f(0, 1)`` spread as varargs) as a tuple."""
    if isinstance(xs, (list, tuple, torch.Size)):
        if len(xs) == 1 and isinstance(xs[0], (list, tuple, torch.Size)):
            return _ints(cx, xs[0])
        return tuple(cx.int(x) for x in xs)
    return (cx.int(xs),)


# --- padding -----------------------------------------------------------------------------------
@op(torch.constant_pad_nd)
def _constant_pad_nd(cx: CaptureContext, out: Any, x: Any, pad: Any, value: Any = 0) -> Value:
    return _padded(cx, x, pad, "constant", value)


@op(F.pad)
def _pad(
    cx: CaptureContext, out: Any, x: Any, pad: Any, mode: str = "constant", value: Any = None
) -> Value:
    if isinstance(value, int) and not isinstance(value, bool):
        # NOTE: F.pad's value is a ``float?`` in its schema: eager rounds an int to float64
        # first (2**60 + 1 pads an int64 tensor with 2**60); constant_pad_nd's is a Scalar
        value = float(value)
    return _padded(cx, x, pad, mode, value)


def _padded(cx: CaptureContext, x: Any, pad: Any, mode: str, value: Any) -> Value:
    pads = _ints(cx, pad)
    v = cx.value(x)
    dtype = _type(v).dtype
    _guard_pad_sizes(cx, _type(v).shape, pads, mode)
    if mode == "constant":
        fill = _scalar_for(cx, 0 if value is None else value, dtype)
        result: Value = cx.call("constant_pad", v, pad=pads, value=fill)
        return result
    if mode not in PAD_MODES:
        raise NoIROp(f"F.pad mode {mode!r} has no IR op")
    if dtype == torch.bool:
        raise NoIROp(f"F.pad({mode!r}) of a bool tensor has no IR op")
    result = cx.call("pad", v, pad=pads, mode=mode)
    return result


def _guard_pad_sizes(
    cx: CaptureContext, shape: Sequence[Any], pads: Sequence[int], mode: str
) -> None:
    """NOTE: the pad's type rule checks a static dim as eager does (a reflect pad less than
    the size, a circular one wrapping once, a nonempty result); a symbolic dim is guarded to
    the same conditions instead (the capture sample met them: eager ran it), so a later call
    at a size eager refuses captures again and raises eager's error, where the kernel's index
    map would have read past the input."""
    if len(pads) % 2 or len(pads) > 2 * len(shape):
        return  # NOTE: the type rule refuses it
    for d, lo, hi in padded_dims(len(shape), pads):
        n = shape[d]
        if isinstance(n, int):
            continue
        out = n + lo + hi
        if mode == "reflect":
            cx.record_predicate(sympy.Gt(n, max(lo, hi)), True)
        if mode == "circular":
            cx.record_predicate(sympy.Ge(n - max(-lo, 0) - max(-hi, 0), max(lo, hi)), True)
        cx.record_predicate(
            sympy.Ge(out, 0) if mode in ("constant", "circular") else sympy.Gt(out, 0), True
        )


# --- roll, flip, rot90 -------------------------------------------------------------------------
@op(*both("roll"))
def _roll(cx: CaptureContext, out: Any, x: Any, shifts: Any, dims: Any = None) -> Value:
    v = cx.value(x)
    s = _ints(cx, shifts)
    d = () if dims is None else _ints(cx, dims)
    if d:
        result: Value = cx.call("roll", v, shifts=s, dims=d)
        return result
    # NOTE: without dims eager rolls the flattened tensor and restores the shape.
    flat = cx.call("reshape", v, shape=(-1,))
    rolled = cx.call("roll", flat, shifts=s, dims=(0,))
    result = cx.call("reshape", rolled, shape=_type(v).shape)
    return result


def _flip_value(cx: CaptureContext, v: Value, dims: Sequence[int]) -> Value:
    out: Value = cx.call("flip", v, dims=tuple(dims))
    return out


@op(*both("flip"))
def _flip(cx: CaptureContext, out: Any, x: Any, *dims: Any, **kwargs: Any) -> Value:
    if "dims" in kwargs:
        dims = (kwargs["dims"],)
    return _flip_value(cx, cx.value(x), _ints(cx, dims))


op(*both("fliplr"))(lambda cx, out, x: _flip_value(cx, cx.value(x), (1,)))
op(*both("flipud"))(lambda cx, out, x: _flip_value(cx, cx.value(x), (0,)))


@op(*both("rot90"))
def _rot90(cx: CaptureContext, out: Any, x: Any, k: Any = 1, dims: Any = (0, 1)) -> Value:
    v = cx.value(x)
    d0, d1 = _ints(cx, dims)
    turns = cx.int(k) % 4
    # NOTE: eager's own decomposition (aten/native/TensorTransformations.cpp).
    if turns == 0:
        return v
    if turns == 2:
        return _flip_value(cx, v, (d0, d1))
    flipped = _flip_value(cx, v, (d1,) if turns == 1 else (d0,))
    result: Value = cx.call("transpose", flipped, dim0=d0, dim1=d1)
    return result


# --- repeat, tile, repeat_interleave -----------------------------------------------------------
def _repeat_value(cx: CaptureContext, v: Value, reps: Sequence[int]) -> Value:
    """``x.repeat(reps)``: x viewed as (1, s0, 1, s1, ...), expanded to (r0, s0, r1, s1, ...)
    and merged to (r0*s0, r1*s1, ...): every element is a copy, as in eager."""
    shape = list(_type(v).shape)
    if len(reps) < len(shape):
        raise ProgramValueError(
            "Number of dimensions of repeat dims can not be smaller than number of dimensions "
            "of tensor"
        )
    shape = [1] * (len(reps) - len(shape)) + shape
    interleaved = tuple(d for s in shape for d in (1, s))
    expanded = tuple(d for r, s in zip(reps, shape) for d in (r, s))
    merged = tuple(r * s for r, s in zip(reps, shape))
    out: Value = cx.call("reshape", v, shape=interleaved)
    out = cx.call("expand", out, shape=expanded)
    out = cx.call("reshape", out, shape=merged)
    return out


@op(T.repeat)
def _repeat(cx: CaptureContext, out: Any, x: Any, *sizes: Any, **kwargs: Any) -> Value:
    if "repeats" in kwargs:
        sizes = (kwargs["repeats"],)
    return _repeat_value(cx, cx.value(x), _ints(cx, sizes))


@op(*both("tile"))
def _tile(cx: CaptureContext, out: Any, x: Any, *dims: Any) -> Value:
    v = cx.value(x)
    reps = _ints(cx, dims)
    reps = (1,) * (_type(v).rank - len(reps)) + reps
    return _repeat_value(cx, v, reps)


@op(*both("repeat_interleave"))
def _repeat_interleave(
    cx: CaptureContext,
    out: Any,
    x: Any,
    repeats: Any = None,
    dim: Any = None,
    *,
    output_size: Any = None,
) -> Value:
    if isinstance(x, T) and (repeats is None or isinstance(repeats, T)):
        # NOTE: a size that depends on the repeats' values (or output_size, checked by PyTorch)
        return datadep.repeat_interleave(cx, out, x, repeats, dim, output_size)
    if not isinstance(x, T) or repeats is None or isinstance(repeats, T):
        cx.fail(
            "data-dependent",
            "repeat_interleave with a tensor of repeats: its output shape depends on the values",
        )
    v = cx.value(x)
    r = cx.int(repeats)
    if dim is None:
        v = cx.call("reshape", v, shape=(-1,))
        d = 0
    else:
        d = cx.int(dim) % max(_type(v).rank, 1)
    shape = list(_type(v).shape)
    if not shape:
        v, shape = cx.call("reshape", v, shape=(1,)), [1]
    wide = (*shape[: d + 1], r, *shape[d + 1 :])
    merged = (*shape[:d], shape[d] * r, *shape[d + 1 :])
    result: Value = cx.call("unsqueeze", v, dim=d + 1)
    result = cx.call("expand", result, shape=wide)
    result = cx.call("reshape", result, shape=merged)
    return result


# --- views -------------------------------------------------------------------------------------
@op(*both("diagonal"))
def _diagonal(
    cx: CaptureContext, out: Any, x: Any, offset: Any = 0, dim1: Any = 0, dim2: Any = 1
) -> Viewed:
    step = ViewStep.of("diagonal", offset=cx.int(offset), dim1=cx.int(dim1), dim2=cx.int(dim2))
    return _view(cx, x, step)


@op(T.unfold)
def _unfold(cx: CaptureContext, out: Any, x: Any, dimension: Any, size: Any, step: Any) -> Viewed:
    attrs = {"dim": cx.int(dimension), "size": cx.int(size), "step": cx.int(step)}
    return _view(cx, x, ViewStep.of("unfold", **attrs))


def _movedim_perm(rank: int, source: Sequence[int], destination: Sequence[int]) -> tuple[int, ...]:
    src = [s % max(rank, 1) for s in source]
    dst = [d % max(rank, 1) for d in destination]
    perm = [-1] * rank
    for s, d in zip(src, dst):
        perm[d] = s
    rest = iter(i for i in range(rank) if i not in src)
    return tuple(p if p >= 0 else next(rest) for p in perm)


@op(*both("movedim", "moveaxis"))
def _movedim(cx: CaptureContext, out: Any, x: Any, source: Any, destination: Any) -> Viewed:
    perm = _movedim_perm(out.dim(), _ints(cx, source), _ints(cx, destination))
    return _view(cx, x, ViewStep.of("permute", dims=perm))


@op(*both("broadcast_to"))
def _broadcast_to(cx: CaptureContext, out: Any, x: Any, size: Any) -> Viewed:
    return _view(cx, x, ViewStep.of("expand", shape=tuple(cx.dim(d) for d in size)))


def _atleast(cx: CaptureContext, x: Any, rank: int) -> Viewed:
    have = _type(cx.value(x)).rank
    if have >= rank:
        return _view(cx, x, ViewStep("identity"))
    if have == 0:
        return _view(cx, x, ViewStep.of("reshape", shape=(1,) * rank))
    # NOTE: eager's atleast_2d puts a 1-D tensor in a row; atleast_3d adds a leading and/or a
    # trailing dim.
    steps = [ViewStep.of("unsqueeze", dim=0)] if have == 1 else []
    if rank == 3:
        steps.append(ViewStep.of("unsqueeze", dim=-1))
    return _view(cx, x, *steps)


def _atleast_rule(rank: int) -> Any:
    def rule(cx: CaptureContext, out: Any, *tensors: Any) -> Any:
        if len(tensors) == 1 and isinstance(tensors[0], T):
            return _atleast(cx, tensors[0], rank)
        items = tensors[0] if len(tensors) == 1 else tensors
        return tuple(_atleast(cx, t, rank) for t in items)

    return rule


for _rank in (1, 2, 3):
    op(getattr(torch, f"atleast_{_rank}d"))(_atleast_rule(_rank))


def _real(cx: CaptureContext, x: Any, name: str) -> None:
    if _type(cx.value(x)).dtype.is_complex:
        raise NoIROp(f"{name} of a complex tensor conjugates; no IR op")


@op(getter("mH"), *both("adjoint"))
def _adjoint(cx: CaptureContext, out: Any, x: Any) -> Viewed:
    _real(cx, x, "the adjoint")
    return _view(cx, x, ViewStep.of("transpose", dim0=-2, dim1=-1))


@op(getter("H"))
def _h(cx: CaptureContext, out: Any, x: Any) -> Viewed:
    _real(cx, x, "Tensor.H")
    if out.dim() < 2:
        return _view(cx, x, ViewStep("identity"))
    return _view(cx, x, ViewStep.of("transpose", dim0=0, dim1=1))


@op(*both("narrow_copy"))
def _narrow_copy(cx: CaptureContext, out: Any, x: Any, dim: Any, start: Any, length: Any) -> Value:
    d = cx.int(dim)
    n = _type(cx.value(x)).shape[d]
    s = cx.int(start)
    s = s + n if s < 0 and isinstance(n, int) else s
    step = ViewStep.of("slice", dim=d, start=s, end=s + cx.int(length), step=1)
    return step.apply(cx, cx.value(x))  # NOTE: a copy: a fresh value, no view


# --- pooling -----------------------------------------------------------------------------------
@op(torch.adaptive_avg_pool1d, F.adaptive_avg_pool1d)
def _adaptive_avg_pool1d(cx: CaptureContext, out: Any, x: Any, output_size: Any) -> Value:
    # NOTE: eager computes it as adaptive_avg_pool2d of the input with a unit height.
    v = cx.call("unsqueeze", cx.value(x), dim=-2)
    size = adaptive_output_size(cx, out, x, output_size, 1)
    v = cx.call("adaptive_avg_pool2d", v, output_size=(1, *size))
    result: Value = cx.call("squeeze", v, dims=(-2,))
    return result


# --- gather, take_along_dim --------------------------------------------------------------------
def _bounds_check(cx: CaptureContext, bad: Value, what: str, dim: int, n: int) -> None:
    """A runtime check (an ``aten_check`` of ``_assert_async.msg``, run in program order and
    never dropped) that raises ``RuntimeError`` naming ``what`` where any of ``bad`` is true:
    eager's gather raises a RuntimeError, the index_select under it an IndexError of
    ``index_select``'s words. CPU only: on CUDA the assert is a device-side one."""
    bt = _type(bad)
    if torch.device(bt.device).type != "cpu":
        return
    ok = cx.call("logical_not", cx.call("any", bad, dims=tuple(range(bt.rank)), keepdim=False))
    marker = torch.empty(0)
    message = f"{what}(): an index is out of bounds for dimension {dim} with size {n}"
    tensors, attrs = call_spec((marker, message), {})
    assert tensors == [marker]
    cx.call("aten_check", [ok], name="_assert_async", overload="msg", **attrs)


def _gather_value(
    cx: CaptureContext, v: Value, dim: int, index: Value, wrap: bool, check: str | None = None
) -> Value:
    """``torch.gather(v, dim, index)`` as one ``index_select`` from the flattened ``v`` at
    the row-major positions ``index * stride[dim] + sum(i_k * stride[k])``: it moves elements,
    so it is bitwise eager's. An index out of range becomes position -1, which index_select
    refuses as eager's gather refuses it (``wrap``: negative indices count from the end once);
    ``check`` (the op's name) raises eager's RuntimeError, naming the op, before it.
    """
    xt, it = _type(v), _type(index)
    if any(isinstance(d, int) and d == 0 for d in it.shape):
        # NOTE: eager takes an empty index of any rank: nothing to gather.
        empty: Value = cx.call("zeros", shape=it.shape, dtype=xt.dtype, device=xt.device)
        return empty
    shape = list(xt.shape) or [1]
    ishape = list(it.shape) or [1]
    if not all(isinstance(n, int) for n in (*shape[1:], shape[dim % len(shape)])):
        # NOTE: the positions take the source's strides (products of its trailing dims) and
        # its size along ``dim`` (the bounds check); its first dim and the index's dims may be
        # symbolic (arange and reshape take size expressions)
        cx.limitation("gather from a source of symbolic dims; specialize them")
    d = dim % len(shape)
    n = shape[d]
    for k, (m, size) in enumerate(zip(ishape, shape)):
        if k != d and not (isinstance(m, int) and isinstance(size, int)):
            # NOTE: eager refuses an index dim past the source's ("Size does not match"); the
            # capture sample met it, the guard keeps it (a wider index reads the next row)
            cx.record_predicate(sympy.Le(m, size), True)
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    idx = index if it.rank else cx.call("reshape", index, shape=(1,))
    if idx.type.dtype != torch.int64:  # type: ignore[union-attr]
        idx = cx.call("to_dtype", idx, dtype=torch.int64)
    if wrap:
        idx = cx.call("where", cx.call("lt", idx, 0), cx.call("add", idx, n), idx)
    bad = cx.call("logical_or", cx.call("lt", idx, 0), cx.call("ge", idx, n))
    if check is not None:
        _bounds_check(cx, bad, check, d, n)
    pos = cx.call("mul", idx, strides[d])
    for k, m in enumerate(ishape):
        if k == d or m == 1:
            continue
        iota = cx.call("arange", start=0, end=m, step=1, dtype=torch.int64, device=xt.device)
        view = tuple(m if j == k else 1 for j in range(len(ishape)))
        pos = cx.call("add", pos, cx.call("mul", cx.call("reshape", iota, shape=view), strides[k]))
    pos = cx.call("where", bad, -1, pos)
    flat = cx.call("reshape", v, shape=(-1,))
    picked = cx.call("index_select", flat, cx.call("reshape", pos, shape=(-1,)), dim=0)
    result: Value = cx.call("reshape", picked, shape=it.shape)
    return result


@op(*both("gather"))
def _gather(
    cx: CaptureContext, out: Any, x: Any, dim: Any, index: Any, *, sparse_grad: bool = False
) -> Value:
    return _gather_value(cx, cx.value(x), cx.int(dim), cx.value(index), wrap=False, check="gather")


@op(*both("take_along_dim"))
def _take_along_dim(cx: CaptureContext, out: Any, x: Any, indices: Any, dim: Any = None) -> Value:
    v, idx = cx.value(x), cx.value(indices)
    if dim is None:
        flat = cx.call("reshape", v, shape=(-1,))
        flat_idx = cx.call("reshape", idx, shape=(-1,))
        return _gather_value(cx, flat, 0, flat_idx, wrap=False, check="take_along_dim")
    d = cx.int(dim) % max(_type(v).rank, 1)
    # NOTE: eager broadcasts x and indices against each other in every dim but ``dim``; the
    # IR's dims (symbolic with dynamic=True), not the sample's
    vshape, ishape = _type(v).shape, _type(idx).shape
    if len(vshape) != len(ishape):
        target = list(out.shape)
    else:
        target = [a if b == 1 else b for a, b in zip(vshape, ishape)]
        target[d] = ishape[d]
    if tuple(_type(idx).shape) != tuple(target):
        idx = cx.call("expand", idx, shape=tuple(target))
    target[d] = _type(v).shape[d] if _type(v).rank else 1
    if tuple(_type(v).shape) != tuple(target):
        v = cx.call("expand", v, shape=tuple(target))
    return _gather_value(cx, v, d, idx, wrap=True, check="take_along_dim")


@op(*both("take"))
def _take(cx: CaptureContext, out: Any, x: Any, index: Any) -> Value:
    flat = cx.call("reshape", cx.value(x), shape=(-1,))
    idx = cx.value(index)
    picked = _gather_value(cx, flat, 0, cx.call("reshape", idx, shape=(-1,)), wrap=True)
    result: Value = cx.call("reshape", picked, shape=_type(idx).shape)
    return result


# --- diagonal matrices -------------------------------------------------------------------------
def _zeros(cx: CaptureContext, out: Any) -> Value:
    v: Value = cx.call("zeros", shape=tuple(out.shape), dtype=out.dtype, device=str(out.device))
    return v


@op(*both("diag_embed"))
def _diag_embed(
    cx: CaptureContext, out: Any, x: Any, offset: Any = 0, dim1: Any = -2, dim2: Any = -1
) -> Value:
    return put_diagonal(
        cx, _zeros(cx, out), cx.value(x), cx.int(offset), cx.int(dim1), cx.int(dim2)
    )


@op(*both("diag"))
def _diag(cx: CaptureContext, out: Any, x: Any, diagonal: Any = 0) -> Value:
    v, k = cx.value(x), cx.int(diagonal)
    if _type(v).rank == 2:
        return ViewStep.of("diagonal", offset=k, dim1=0, dim2=1).apply(cx, v)  # NOTE: a copy
    return put_diagonal(cx, _zeros(cx, out), v, k, 0, 1)


# --- conjugation of real tensors -----------------------------------------------------------------
@op(*both("conj", "resolve_conj", "resolve_neg", "conj_physical", "real"), getter("real"))
def _real_identity(cx: CaptureContext, out: Any, x: Any) -> Viewed:
    # NOTE: on a real tensor eager returns the tensor itself: an identity alias.
    _real(cx, x, "conjugation")
    return _view(cx, x, ViewStep("identity"))

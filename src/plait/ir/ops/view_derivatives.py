"""Derivatives of the view and shape ops."""

from __future__ import annotations

import sympy

from plait.ir.graph import Operand, Value
from plait.ir.ops.rules import wrap_dim, wrap_dims
from plait.ir.ops.vjp import VjpContext, nondifferentiable, torch_vjp_rule, vjp
from plait.ir.types import TensorType
from plait.symbolic import Dim, dims_equal, normalize

# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: a view's gradient moves the cotangent's elements back where they came from: reshapes,
# permutations, slices and zero padding; the only arithmetic is summing what one element gave
# several outputs (expand). Each gradient has its operand's type exactly.


def _tensor(v: Operand) -> TensorType:
    assert isinstance(v, Value) and isinstance(v.type, TensorType)
    return v.type


def cast_to(ctx: VjpContext, g: Value, t: TensorType) -> Value:
    """``g`` in ``t``'s dtype (an operand of a promoting op: cat, stack)."""
    return g if _tensor(g).dtype == t.dtype else ctx.call("to_dtype", g, dtype=t.dtype)


def zeros_of(ctx: VjpContext, t: TensorType) -> Value:
    return ctx.call("zeros", shape=t.shape, dtype=t.dtype, device=t.device)


def pad_along(ctx: VjpContext, g: Value, dim: int, before: Dim, after: Dim) -> Value:
    """``g`` with ``before``/``after`` zeros added along ``dim`` (a negative integer count crops):
    a ``constant_pad`` where both counts are integers, else a cat with zeros (symbolic counts,
    nonnegative)."""
    t = _tensor(g)
    if isinstance(before, int) and isinstance(after, int):
        if before == 0 and after == 0:
            return g
        pad = (0, 0) * (t.rank - 1 - dim) + (before, after)
        return ctx.call("constant_pad", g, pad=pad, value=0)
    parts = []
    for n, piece in ((before, None), (0, g), (after, None)):
        if piece is not None:
            parts.append(piece)
        elif not dims_equal(n, 0):
            parts.append(zeros_of(ctx, t.with_shape((*t.shape[:dim], n, *t.shape[dim + 1 :]))))
    return parts[0] if len(parts) == 1 else ctx.call("cat", parts, dim=dim)


def spread_along(ctx: VjpContext, g: Value, dim: int, step: int) -> Value:
    """``g`` with ``step - 1`` zeros after each element along ``dim`` (length ``n * step``): the
    elements land where a slice of stride ``step`` read them."""
    if step == 1:
        return g
    t = _tensor(g)
    wide = pad_along(ctx, ctx.call("unsqueeze", g, dim=dim + 1), dim + 1, 0, step - 1)
    n = normalize(t.shape[dim] * step)
    return ctx.call("reshape", wide, shape=(*t.shape[:dim], n, *t.shape[dim + 1 :]))


def _reshape_back(ctx: VjpContext) -> list[Operand | None]:
    return [ctx.call("reshape", ctx.grad(), shape=_tensor(ctx.inputs[0]).shape)]


vjp("view", "reshape", "flatten", "unsqueeze", "squeeze")(_reshape_back)


@vjp("contiguous")
def _identity_vjp(ctx: VjpContext) -> list[Operand | None]:
    return [ctx.grad()]


nondifferentiable("detach")


@vjp("permute")
def _permute_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tensor(ctx.inputs[0])
    axes = wrap_dims(ctx.attrs["dims"], x.rank, "permute")
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return [ctx.call("permute", ctx.grad(), dims=tuple(inverse))]


@vjp("transpose")
def _transpose_vjp(ctx: VjpContext) -> list[Operand | None]:
    a, b = ctx.attrs["dim0"], ctx.attrs["dim1"]
    return [ctx.call("transpose", ctx.grad(), dim0=a, dim1=b)]


@vjp("expand")
def _expand_vjp(ctx: VjpContext) -> list[Operand | None]:
    return [ctx.sum_to(ctx.grad(), _tensor(ctx.inputs[0]))]


@vjp("cat")
def _cat_vjp(ctx: VjpContext) -> list[Operand | None]:
    g = ctx.grad()
    out = _tensor(ctx.outputs[0])
    d = wrap_dim(ctx.attrs["dim"], out.rank, "cat")
    grads: list[Operand | None] = []
    start: Dim = 0
    for i, x in enumerate(ctx.inputs):
        t = _tensor(x)
        # NOTE: cat skips 1-D empty operands (they hold no elements of the result)
        if t.rank == 1 and dims_equal(t.shape[0], 0) and out.rank != 1:
            grads.append(zeros_of(ctx, t) if ctx.wants(i) else None)
            continue
        end = normalize(start + t.shape[d])
        if ctx.wants(i):
            piece = g if out.rank and dims_equal(t.shape[d], out.shape[d]) else None
            if piece is None:
                piece = ctx.call("slice", g, dim=d, start=start, end=end, step=1)
            grads.append(cast_to(ctx, piece, t))
        else:
            grads.append(None)
        start = end
    return grads


@vjp("stack")
def _stack_vjp(ctx: VjpContext) -> list[Operand | None]:
    g = ctx.grad()
    d = wrap_dim(ctx.attrs["dim"], _tensor(ctx.outputs[0]).rank, "stack")
    return [
        cast_to(ctx, ctx.call("select", g, dim=d, index=i), _tensor(x)) if ctx.wants(i) else None
        for i, x in enumerate(ctx.inputs)
    ]


@vjp("split", "chunk")
def _split_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: pieces nobody read have no cotangent: ctx.grad gives their zeros
    pieces = [ctx.grad(i) for i in range(len(ctx.outputs))]
    if len(pieces) == 1:
        return [pieces[0]]
    d = wrap_dim(ctx.attrs["dim"], _tensor(ctx.inputs[0]).rank, ctx.node.op)
    return [ctx.call("cat", pieces, dim=d)]


@vjp("slice")
def _slice_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tensor(ctx.inputs[0])
    d = wrap_dim(ctx.attrs["dim"], x.rank, "slice")
    start, end, step = ctx.attrs["start"], ctx.attrs["end"], ctx.attrs["step"]
    n = x.shape[d]
    length = _tensor(ctx.outputs[0]).shape[d]
    if dims_equal(length, 0):
        return [zeros_of(ctx, x)]
    g = ctx.grad()
    static = all(isinstance(v, int) or v is None for v in (n, start, end))
    if static:
        assert isinstance(n, int) and isinstance(length, int)
        lo = range(*slice(start, end, step).indices(n)).start
        # NOTE: the spread cotangent ends with step - 1 zeros past the last element read; a
        # negative `after` crops only those
        return [pad_along(ctx, spread_along(ctx, g, d, step), d, lo, n - lo - length * step)]
    if step != 1:
        return torch_vjp_rule(ctx)  # NOTE: a strided slice of a symbolic dim
    lo = normalize(sympy.Min(start or 0, n))
    return [pad_along(ctx, g, d, lo, normalize(n - lo - length))]


@vjp("select")
def _select_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tensor(ctx.inputs[0])
    d = wrap_dim(ctx.attrs["dim"], x.rank, "select")
    index, n = ctx.attrs["index"], x.shape[d]
    at = normalize(index + n) if index < 0 else index
    g = ctx.call("unsqueeze", ctx.grad(), dim=d)
    return [pad_along(ctx, g, d, at, normalize(n - at - 1))]

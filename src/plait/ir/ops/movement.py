"""Data-movement ops beyond plain views: padding, rolling, flipping, diagonals, sliding windows.

Each output element is one input element (or, for ``constant_pad``, the fill value): no
arithmetic, so every backend must agree with eager bitwise. Codegen lowers them as index maps
(``pad``, ``roll``, ``flip``, ``diagonal``, ``unfold``) or as a select with a default
(``constant_pad``); see :mod:`plait.codegen.views`.

Example:
    >>> import torch
    >>> from plait.ir import Value
    >>> from plait.ir.ops import get_op
    >>> from plait.ir.types import TensorType
    >>> x = Value("x", TensorType((2, 3), torch.float32))
    >>> _, _, (out,) = get_op("constant_pad").infer([x], {"pad": (1, -1, 2, 0)})
    >>> out.shape
    (4, 3)
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
import torch.nn.functional as F

from plait.ir.errors import IRValueError
from plait.ir.graph import Operand, Value
from plait.ir.ops.registry import Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.ops.rules import wrap_dim, wrap_dims
from plait.ir.ops.view import ALL
from plait.ir.ops.view_derivatives import pad_along, spread_along, zeros_of
from plait.ir.ops.vjp import VjpContext, torch_vjp_rule, vjp
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, Type
from plait.symbolic import Dim, dims_equal, normalize

PAD_MODES = ("reflect", "replicate", "circular")


def padded_dims(rank: int, pad: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(dim, before, after)`` per padded dim: ``pad`` lists (before, after) pairs from the
    last dim backwards, as ``torch.nn.functional.pad`` takes them."""
    return [(rank - 1 - k, pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)]


def _pad_shape(name: str, x: TensorType, pad: Sequence[int]) -> list[Dim]:
    if len(pad) % 2 or len(pad) > 2 * x.rank:
        raise TypeRuleError(
            f"{name}: pad {list(pad)} must be (before, after) pairs for at most {x.rank} dims"
        )
    shape = list(x.shape)
    for d, lo, hi in padded_dims(x.rank, pad):
        n = normalize(shape[d] + lo + hi)
        if isinstance(n, int) and n < 0:
            raise TypeRuleError(f"{name}: pad {list(pad)} leaves dim {d} of {x} negative")
        shape[d] = n
    return shape


def _constant_pad_rule(x: TensorType, pad: tuple[int, ...], value: float | int) -> list[Type]:
    return [x.with_shape(tuple(_pad_shape("constant_pad", x, pad)))]


register(
    OpDef(
        "constant_pad",
        Category.VIEW,
        (Param("x"),),
        (Attr("pad", "ints"), Attr("value", "scalar", 0)),
        _constant_pad_rule,
        lambda x, pad, value: F.pad(x, list(pad), mode="constant", value=value),
        ALL,
        "F.pad(mode='constant'): negative pads crop; new elements are `value` in x's dtype",
    )
)


def _pad_rule(x: TensorType, pad: tuple[int, ...], mode: str) -> list[Type]:
    if mode not in PAD_MODES:
        raise TypeRuleError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    k = len(pad) // 2
    if len(pad) % 2 or not 1 <= k <= 3 or x.rank not in (k + 1, k + 2):
        raise TypeRuleError(
            f"pad: {mode} padding of {k} dims takes a {k + 1}-D or {k + 2}-D input, got {x}"
        )
    shape = _pad_shape("pad", x, pad)
    for d, lo, hi in padded_dims(x.rank, pad):
        n, out = x.shape[d], shape[d]
        if not (isinstance(n, int) and isinstance(out, int)):
            continue  # NOTE: eager checks the pads against the sizes it is given
        if mode == "reflect" and max(lo, hi) >= n:
            raise TypeRuleError(f"pad: reflect padding {lo, hi} must be less than dim {d} ({n})")
        if mode == "circular" and max(lo, hi) > n - max(-lo, 0) - max(-hi, 0):
            raise TypeRuleError(f"pad: circular padding {lo, hi} wraps dim {d} more than once")
        if mode != "circular" and out <= 0:
            raise TypeRuleError(f"pad: {mode} padding {lo, hi} leaves dim {d} of {x} empty")
    return [x.with_shape(tuple(shape))]


register(
    OpDef(
        "pad",
        Category.VIEW,
        (Param("x"),),
        (Attr("pad", "ints"), Attr("mode", "str")),
        _pad_rule,
        lambda x, pad, mode: F.pad(x, list(pad), mode=mode),
        (*FLOAT_DTYPES, *INT_DTYPES),
        "F.pad in reflect, replicate or circular mode (circular crops before it wraps)",
    )
)


def _roll_rule(x: TensorType, shifts: tuple[int, ...], dims: tuple[int, ...]) -> list[Type]:
    if len(shifts) != len(dims) or not dims:
        raise TypeRuleError(f"roll: one shift per dim, got shifts {shifts} and dims {dims}")
    wrap_dims(dims, max(x.rank, 1), "roll")
    return [x]


register(
    OpDef(
        "roll",
        Category.VIEW,
        (Param("x"),),
        (Attr("shifts", "ints"), Attr("dims", "ints")),
        _roll_rule,
        lambda x, shifts, dims: torch.roll(x, shifts, dims),
        ALL,
        "torch.roll along the given dims (the dims-less roll is a roll of the flattened tensor)",
    )
)


def _flip_rule(x: TensorType, dims: tuple[int, ...]) -> list[Type]:
    axes = wrap_dims(dims, max(x.rank, 1), "flip")
    if len(set(axes)) != len(axes):
        raise TypeRuleError(f"flip: dims {list(dims)} repeat a dim")
    return [x]


register(
    OpDef(
        "flip",
        Category.VIEW,
        (Param("x"),),
        (Attr("dims", "ints"),),
        _flip_rule,
        lambda x, dims: torch.flip(x, dims),
        ALL,
    )
)


def diagonal_length(n1: Dim, n2: Dim, offset: int) -> Dim:
    if isinstance(n1, int) and isinstance(n2, int):
        return max(min(n1 + min(offset, 0), n2 - max(offset, 0)), 0)
    return normalize(sympy.Max(sympy.Min(n1 + min(offset, 0), n2 - max(offset, 0)), 0))


def _diagonal_rule(x: TensorType, offset: int, dim1: int, dim2: int) -> list[Type]:
    if x.rank < 2:
        raise TypeRuleError(f"diagonal: needs at least 2 dims, got {x}")
    a, b = wrap_dim(dim1, x.rank, "diagonal"), wrap_dim(dim2, x.rank, "diagonal")
    if a == b:
        raise TypeRuleError(f"diagonal: dim1 and dim2 are the same dim {a}")
    n1, n2 = x.shape[a], x.shape[b]
    rest = [d for i, d in enumerate(x.shape) if i not in (a, b)]
    return [x.with_shape((*rest, diagonal_length(n1, n2, offset)))]


register(
    OpDef(
        "diagonal",
        Category.VIEW,
        (Param("x"),),
        (Attr("offset", "int", 0), Attr("dim1", "int", 0), Attr("dim2", "int", 1)),
        _diagonal_rule,
        lambda x, offset, dim1, dim2: torch.diagonal(x, offset, dim1, dim2),
        ALL,
        "the diagonal of dims (dim1, dim2) as a new last dim (a view in eager)",
    )
)


def _unfold_rule(x: TensorType, dim: int, size: int, step: int) -> list[Type]:
    d = wrap_dim(dim, max(x.rank, 1), "unfold")
    n = x.shape[d] if x.rank else 1
    if not isinstance(n, int):
        raise TypeRuleError(f"unfold: dim {d} of {x} is symbolic; specialize it")
    if step <= 0 or size < 0 or size > n:
        raise TypeRuleError(f"unfold: size {size} / step {step} do not fit dim {d} ({n})")
    windows = (n - size) // step + 1
    if x.rank == 0:
        return [x.with_shape((size,))]
    return [x.with_shape((*x.shape[:d], windows, *x.shape[d + 1 :], size))]


register(
    OpDef(
        "unfold",
        Category.VIEW,
        (Param("x"),),
        (Attr("dim", "int"), Attr("size", "int"), Attr("step", "int")),
        _unfold_rule,
        lambda x, dim, size, step: x.unfold(dim, size, step),
        ALL,
        "Tensor.unfold: sliding windows of `size` every `step` along dim, as a new last dim",
    )
)


# --- derivatives (plait.ir.ops.vjp) -----------------------------------------------------------
# NOTE: each rule moves the cotangent's elements back to the input elements they were read from
# (slices, flips, rolls, zero padding, reshapes); an input element read several times (padding's
# mirrored, clamped or wrapped borders, unfold's overlapping windows) gets the sum of its
# cotangents, added in the order of the outputs that read it, as eager's backward kernels do.
# A padding of several dims sums dim by dim: a corner element's block of cotangents is added in
# another order than eager's single row-major pass (last-bit differences).


def _tensor(v: Operand) -> TensorType:
    assert isinstance(v, Value) and isinstance(v.type, TensorType)
    return v.type


@vjp("constant_pad")
def _constant_pad_vjp(ctx: VjpContext) -> list[Operand | None]:
    # NOTE: padding crops back what it added and pads zeros where it cropped
    pad = tuple(-p for p in ctx.attrs["pad"])
    g = ctx.grad()
    return [ctx.call("constant_pad", g, pad=pad, value=0) if any(pad) else g]


def pad_sources(mode: str, n: int, before: int, after: int) -> list[int]:
    """For each output index of a 1-D ``mode`` padding of ``n`` elements by ``(before, after)``,
    the input index it reads (eager's index maps, negative pads included)."""
    out = range(n + before + after)
    if mode == "reflect":
        return [abs(j - before) if j < before else (n - 1) - abs(n - 1 - (j - before)) for j in out]
    if mode == "replicate":
        return [min(max(j - before, 0), n - 1) for j in out]
    if mode == "circular":
        # NOTE: negative pads crop first; the cropped m elements wrap
        m = n - max(-before, 0) - max(-after, 0)
        return [(j - max(before, 0)) % m + max(-before, 0) for j in out]
    raise IRValueError(f"pad: unknown mode {mode!r}")


def _runs(src: Sequence[int]) -> list[tuple[int, int, int]]:
    """``src`` cut into runs ``(first, end, slope)`` of outputs reading consecutive inputs
    (slope 1 or -1) or one input (slope 0); a run of equal sources is kept whole."""
    runs = []
    j = 0
    while j < len(src):
        k = j + 1
        slope = src[k] - src[j] if k < len(src) else 1
        if slope not in (-1, 0, 1):
            slope = 1
        else:
            while k < len(src) and src[k] - src[k - 1] == slope:
                if slope and k + 1 < len(src) and src[k + 1] == src[k]:
                    break  # NOTE: the next run repeats src[k]: it reads it from its first element
                k += 1
        runs.append((j, k, slope))
        j = k
    return runs


def _unpad_dim(ctx: VjpContext, g: Value, d: int, src: Sequence[int], n: int) -> Value:
    """The gradient of a padding along dim ``d`` whose outputs read ``src`` of ``n`` inputs."""
    total: Value | None = None
    for first, end, slope in _runs(src):
        piece = g
        if (first, end) != (0, len(src)):
            piece = ctx.call("slice", g, dim=d, start=first, end=end, step=1)
        if slope == 0 and end - first > 1:
            piece = ctx.call("sum", piece, dims=(d,), keepdim=True)
        lo = min(src[first], src[end - 1])
        if slope == -1:
            piece = ctx.call("flip", piece, dims=(d,))
        width = 1 if slope == 0 else end - first
        piece = pad_along(ctx, piece, d, lo, n - lo - width)
        total = piece if total is None else ctx.call("add", total, piece)
    assert total is not None
    return total


@vjp("pad")
def _pad_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tensor(ctx.inputs[0])
    pads = padded_dims(x.rank, ctx.attrs["pad"])
    if not all(isinstance(x.shape[d], int) for d, _, _ in pads):
        return torch_vjp_rule(ctx)  # NOTE: the index maps of symbolic dims are not written out
    g = ctx.grad()
    if any(dims_equal(n, 0) for n in _tensor(g).shape):
        return [zeros_of(ctx, x)]
    for d, before, after in pads:
        n = x.shape[d]
        assert isinstance(n, int)
        g = _unpad_dim(ctx, g, d, pad_sources(ctx.attrs["mode"], n, before, after), n)
    return [g]


@vjp("roll")
def _roll_vjp(ctx: VjpContext) -> list[Operand | None]:
    shifts = tuple(-s for s in ctx.attrs["shifts"])
    return [ctx.call("roll", ctx.grad(), shifts=shifts, dims=ctx.attrs["dims"])]


@vjp("flip")
def _flip_vjp(ctx: VjpContext) -> list[Operand | None]:
    return [ctx.call("flip", ctx.grad(), dims=ctx.attrs["dims"])]


@vjp("diagonal")
def _diagonal_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tensor(ctx.inputs[0])
    a = wrap_dim(ctx.attrs["dim1"], x.rank, "diagonal")
    b = wrap_dim(ctx.attrs["dim2"], x.rank, "diagonal")
    offset = ctx.attrs["offset"]
    n1, n2 = x.shape[a], x.shape[b]
    length = _tensor(ctx.outputs[0]).shape[-1]
    if not (isinstance(n1, int) and isinstance(n2, int) and isinstance(length, int)):
        return torch_vjp_rule(ctx)  # NOTE: the plane's flat offsets need integer sizes
    if length == 0:
        return [zeros_of(ctx, x)]
    # NOTE: in the (dim1, dim2) plane flattened row-major, the diagonal is a strided slice: it
    # starts at `offset` (above) or -offset rows down (below) and steps n2 + 1
    rest = [i for i in range(x.rank) if i not in (a, b)]
    rest_shape = tuple(x.shape[i] for i in rest)
    first = offset if offset >= 0 else -offset * n2
    g = spread_along(ctx, ctx.grad(), len(rest), n2 + 1)
    g = pad_along(ctx, g, len(rest), first, n1 * n2 - first - length * (n2 + 1))
    g = ctx.call("reshape", g, shape=(*rest_shape, n1, n2))
    order = [*rest, a, b]
    inverse = [0] * x.rank
    for i, axis in enumerate(order):
        inverse[axis] = i
    if inverse != list(range(x.rank)):
        g = ctx.call("permute", g, dims=tuple(inverse))
    return [g]


@vjp("unfold")
def _unfold_vjp(ctx: VjpContext) -> list[Operand | None]:
    x = _tensor(ctx.inputs[0])
    size, step = ctx.attrs["size"], ctx.attrs["step"]
    g = ctx.grad()
    if size == 0 or any(dims_equal(n, 0) for n in _tensor(g).shape):
        return [zeros_of(ctx, x)]
    if x.rank == 0:
        return [ctx.call("reshape", g, shape=())]
    d = wrap_dim(ctx.attrs["dim"], x.rank, "unfold")
    n = x.shape[d]
    assert isinstance(n, int)
    windows = (n - size) // step + 1
    # NOTE: windows next to their positions: (*before, windows, size, *after)
    if d != x.rank - 1:
        dims = (*range(d + 1), x.rank, *range(d + 1, x.rank))
        g = ctx.call("permute", g, dims=dims)
    flat_shape = (*x.shape[:d], windows * step, *x.shape[d + 1 :])
    total: Value | None = None
    # NOTE: positions [c*step, (c+1)*step) of every window do not overlap: each block lands by a
    # reshape; an element gets its windows' cotangents from the last block down, i.e. in
    # increasing window order, as eager's unfold_backward adds them
    for c in reversed(range(-(-size // step))):
        lo, hi = c * step, min((c + 1) * step, size)
        block = g
        if (lo, hi) != (0, size):
            block = ctx.call("slice", g, dim=d + 1, start=lo, end=hi, step=1)
        block = pad_along(ctx, block, d + 1, 0, step - (hi - lo))
        block = ctx.call("reshape", block, shape=flat_shape)
        block = pad_along(ctx, block, d, lo, n - lo - windows * step)
        total = block if total is None else ctx.call("add", total, block)
    assert total is not None
    return [total]

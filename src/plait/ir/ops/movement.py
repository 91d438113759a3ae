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

from plait.ir.ops.registry import Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.ops.rules import wrap_dim, wrap_dims
from plait.ir.ops.view import ALL
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, Type
from plait.symbolic import Dim, normalize

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

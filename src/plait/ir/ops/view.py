"""View and shape ops. In the IR every op has value semantics: a view is a new value whose
contents are a rearrangement of its input; aliasing is a codegen concern, not a semantic one.
Derivatives in :mod:`plait.ir.ops.view_derivatives`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from plait.ir.ops.registry import VARIADIC, Attr, Category, OpDef, Param, TypeRuleError, register
from plait.ir.ops.rules import device_of, wrap_dim, wrap_dims
from plait.ir.types import FLOAT_DTYPES, INT_DTYPES, TensorType, Type
from plait.symbolic import Dim, dims_equal, known_equal, normalize, product

ALL = (*FLOAT_DTYPES, *INT_DTYPES, torch.bool)


def _infer_shape(name: str, x: TensorType, shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """Resolve a single ``-1`` and check that the element count is kept."""
    holes = [i for i, d in enumerate(shape) if isinstance(d, int) and d == -1]
    if len(holes) > 1:
        raise TypeRuleError(f"{name}: only one dim may be -1, got {list(shape)}")
    if any(isinstance(d, int) and d < -1 for d in shape):
        raise TypeRuleError(f"{name}: invalid shape {list(shape)}")
    known = product(d for d in shape if not (isinstance(d, int) and d == -1))
    if holes:
        if dims_equal(known, 0):
            raise TypeRuleError(f"{name}: cannot infer -1 in {list(shape)} with a zero dim")
        out = list(shape)
        out[holes[0]] = _exact_div(name, x.numel, known, shape)
        shape = out
    if not known_equal(product(shape), x.numel):
        if x.is_static and all(isinstance(d, int) for d in shape):
            raise TypeRuleError(
                f"{name}: shape {list(shape)} does not hold the {x.numel} elements of {x}"
            )
        raise TypeRuleError(
            f"{name}: cannot prove that shape {list(shape)} holds the "
            f"{x.numel} elements of {x}; specialize the dims"
        )
    return tuple(shape)


def _exact_div(name: str, numel: Dim, known: Dim, shape: Sequence[Dim]) -> Dim:
    if isinstance(numel, int) and isinstance(known, int):
        if numel % known:
            raise TypeRuleError(f"{name}: {numel} elements do not reshape to {list(shape)}")
        return numel // known
    quotient = sympy.simplify(
        sympy.Integer(numel) / known if isinstance(numel, int) else numel / known
    )
    if not quotient.is_integer:
        raise TypeRuleError(
            f"{name}: cannot prove that {numel} elements reshape to "
            f"{list(shape)}; specialize the dims"
        )
    return normalize(quotient)


def _reshape_rule(name: str) -> Any:
    def rule(x: TensorType, shape: tuple) -> list[Type]:
        return [x.with_shape(_infer_shape(name, x, shape))]

    return rule


register(
    OpDef(
        "view",
        Category.VIEW,
        (Param("x"),),
        (Attr("shape", "dims"),),
        _reshape_rule("view"),
        # NOTE: value semantics: the IR's view is the reshaped value, whatever the strides of its
        # operand (passes may drop a `contiguous` before it); memory sharing is codegen's business.
        lambda x, shape: x.reshape(shape),
        ALL,
        "reshape; spelled view when the program asked for a view",
    )
)
register(
    OpDef(
        "reshape",
        Category.VIEW,
        (Param("x"),),
        (Attr("shape", "dims"),),
        _reshape_rule("reshape"),
        lambda x, shape: x.reshape(shape),
        ALL,
    )
)


def _permute_rule(x: TensorType, dims: tuple[int, ...]) -> list[Type]:
    if len(dims) != x.rank:
        raise TypeRuleError(f"permute: {list(dims)} does not name each of {x.rank} dims once")
    axes = wrap_dims(dims, x.rank, "permute")
    return [x.with_shape(tuple(x.shape[a] for a in axes))]


register(
    OpDef(
        "permute",
        Category.VIEW,
        (Param("x"),),
        (Attr("dims", "ints"),),
        _permute_rule,
        lambda x, dims: x.permute(dims),
        ALL,
    )
)


def _transpose_rule(x: TensorType, dim0: int, dim1: int) -> list[Type]:
    a, b = wrap_dim(dim0, x.rank, "transpose"), wrap_dim(dim1, x.rank, "transpose")
    shape = list(x.shape)
    if x.rank:
        shape[a], shape[b] = shape[b], shape[a]
    return [x.with_shape(tuple(shape))]


register(
    OpDef(
        "transpose",
        Category.VIEW,
        (Param("x"),),
        (Attr("dim0", "int"), Attr("dim1", "int")),
        _transpose_rule,
        lambda x, dim0, dim1: x.transpose(dim0, dim1),
        ALL,
    )
)


def _expand_rule(x: TensorType, shape: tuple) -> list[Type]:
    if len(shape) < x.rank:
        raise TypeRuleError(f"expand: {list(shape)} has fewer dims than {x}")
    lead = len(shape) - x.rank
    out: list[Dim] = []
    for i, d in enumerate(shape):
        if i < lead:
            if isinstance(d, int) and d < 0:
                raise TypeRuleError(f"expand: new leading dim {i} cannot be {d}")
            out.append(d)
            continue
        old = x.shape[i - lead]
        if isinstance(d, int) and d == -1:
            out.append(old)
        elif dims_equal(old, d) or dims_equal(old, 1):
            out.append(d)
        else:
            raise TypeRuleError(f"expand: dim {i} of {x} ({old}) cannot expand to {d}")
    return [x.with_shape(tuple(out))]


register(
    OpDef(
        "expand",
        Category.VIEW,
        (Param("x"),),
        (Attr("shape", "dims"),),
        _expand_rule,
        lambda x, shape: x.expand(shape),
        ALL,
    )
)


def _unsqueeze_rule(x: TensorType, dim: int) -> list[Type]:
    d = wrap_dim(dim, x.rank + 1, "unsqueeze")
    shape = list(x.shape)
    shape.insert(d, 1)
    return [x.with_shape(tuple(shape))]


register(
    OpDef(
        "unsqueeze",
        Category.VIEW,
        (Param("x"),),
        (Attr("dim", "int"),),
        _unsqueeze_rule,
        lambda x, dim: x.unsqueeze(dim),
        ALL,
    )
)


def _squeeze_rule(x: TensorType, dims: tuple[int, ...] | None) -> list[Type]:
    axes = wrap_dims(dims, x.rank, "squeeze") if x.rank else ()
    # NOTE: a symbolic dim is never 1 (size-1 dims are specialized), so it is kept.
    drop = {a for a in axes if dims_equal(x.shape[a], 1)}
    return [x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in drop))]


def _squeeze_ref(x: torch.Tensor, dims: tuple[int, ...] | None) -> torch.Tensor:
    return x.squeeze() if dims is None else x.squeeze(dims)


register(
    OpDef(
        "squeeze",
        Category.VIEW,
        (Param("x"),),
        (Attr("dims", "ints?", None),),
        _squeeze_rule,
        _squeeze_ref,
        ALL,
    )
)


def _flatten_rule(x: TensorType, start_dim: int, end_dim: int) -> list[Type]:
    if x.rank == 0:
        return [x.with_shape((1,))]
    s, e = wrap_dim(start_dim, x.rank, "flatten"), wrap_dim(end_dim, x.rank, "flatten")
    if s > e:
        raise TypeRuleError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = (*x.shape[:s], product(x.shape[s : e + 1]), *x.shape[e + 1 :])
    return [x.with_shape(shape)]


register(
    OpDef(
        "flatten",
        Category.VIEW,
        (Param("x"),),
        (Attr("start_dim", "int", 0), Attr("end_dim", "int", -1)),
        _flatten_rule,
        lambda x, start_dim, end_dim: torch.flatten(x, start_dim, end_dim),
        ALL,
    )
)


def _cat_rule(*xs: Any, dim: int) -> list[Type]:
    (tensors,) = xs
    # NOTE: like PyTorch, 1-D empty tensors are skipped when concatenating.
    ranked = [t for t in tensors if not (t.rank == 1 and dims_equal(t.shape[0], 0))]
    if not ranked:
        return [tensors[0]]
    first = ranked[0]
    d = wrap_dim(dim, first.rank, "cat")
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    for t in ranked[1:]:
        if t.rank != first.rank or not all(
            dims_equal(a, b) for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != d
        ):
            raise TypeRuleError(f"cat: {t} does not match {first} outside dim {d}")
    shape = list(first.shape)
    shape[d] = normalize(sum((t.shape[d] for t in ranked), start=0))
    return [TensorType(tuple(shape), dtype, device_of(*tensors))]


register(
    OpDef(
        "cat",
        Category.VIEW,
        (Param("tensors", VARIADIC),),
        (Attr("dim", "int", 0),),
        _cat_rule,
        lambda tensors, dim: torch.cat(tensors, dim),
        ALL,
    )
)


def _stack_rule(*xs: Any, dim: int) -> list[Type]:
    (tensors,) = xs
    first = tensors[0]
    for t in tensors[1:]:
        if t.rank != first.rank or not all(dims_equal(a, b) for a, b in zip(t.shape, first.shape)):
            raise TypeRuleError(f"stack: {t} does not match {first}")
    d = wrap_dim(dim, first.rank + 1, "stack")
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    shape = list(first.shape)
    shape.insert(d, len(tensors))
    return [TensorType(tuple(shape), dtype, device_of(*tensors))]


register(
    OpDef(
        "stack",
        Category.VIEW,
        (Param("tensors", VARIADIC),),
        (Attr("dim", "int", 0),),
        _stack_rule,
        lambda tensors, dim: torch.stack(tensors, dim),
        ALL,
    )
)


def _split_rule(x: TensorType, sizes: tuple, dim: int) -> list[Type]:
    d = wrap_dim(dim, x.rank, "split")
    if x.rank == 0:
        raise TypeRuleError("split: cannot split a rank-0 tensor")
    total = normalize(sum(sizes, start=0))
    if not known_equal(total, x.shape[d]):
        hint = (
            ""
            if isinstance(total, int) and isinstance(x.shape[d], int)
            else ("; cannot prove it, specialize the dims")
        )
        raise TypeRuleError(f"split: sizes {list(sizes)} do not add up to dim {d} of {x}{hint}")
    return [x.with_shape((*x.shape[:d], s, *x.shape[d + 1 :])) for s in sizes]


register(
    OpDef(
        "split",
        Category.VIEW,
        (Param("x"),),
        (Attr("sizes", "dims"), Attr("dim", "int", 0)),
        _split_rule,
        lambda x, sizes, dim: torch.split(x, list(sizes), dim),
        ALL,
        "split into pieces of the given sizes (one output each)",
        fixed_outputs=None,
    )
)


def chunk_sizes(n: int, chunks: int) -> list[int]:
    """PyTorch's chunking: pieces of ceil(n/chunks), the last one smaller; may give fewer."""
    step = -(-n // chunks) if n else 0
    if step == 0:
        return [0] * chunks if n == 0 else []
    return [min(step, n - i) for i in range(0, n, step)]


def _chunk_rule(x: TensorType, chunks: int, dim: int) -> list[Type]:
    d = wrap_dim(dim, x.rank, "chunk")
    n = x.shape[d]
    if not isinstance(n, int):
        raise TypeRuleError(f"chunk: dim {d} of {x} is symbolic; specialize it or use split")
    if chunks <= 0:
        raise TypeRuleError(f"chunk: chunks must be positive, got {chunks}")
    return [x.with_shape((*x.shape[:d], s, *x.shape[d + 1 :])) for s in chunk_sizes(n, chunks)]


register(
    OpDef(
        "chunk",
        Category.VIEW,
        (Param("x"),),
        (Attr("chunks", "int"), Attr("dim", "int", 0)),
        _chunk_rule,
        lambda x, chunks, dim: torch.chunk(x, chunks, dim),
        ALL,
        fixed_outputs=None,
    )
)


def _slice_length(n: Dim, start: Dim | None, end: Dim | None, step: int) -> Dim:
    """Python slice semantics (bounds clamped to the size). With symbolic sizes or bounds, an
    integer bound must be nonnegative (a negative one's meaning depends on the size) and a
    symbolic bound is a size expression, nonnegative by construction."""
    if isinstance(n, int) and all(isinstance(v, int) or v is None for v in (start, end)):
        return len(range(*slice(start, end, step).indices(n)))
    if any(isinstance(v, int) and v < 0 for v in (start, end)):
        raise TypeRuleError(f"slice: negative bounds on symbolic dim {n}; specialize it")
    lo = sympy.Min(start or 0, n)
    hi = n if end is None else sympy.Min(end, n)
    return normalize(sympy.Max(0, sympy.ceiling((hi - lo) / step)))


def _slice_rule(
    x: TensorType, dim: int, start: Dim | None, end: Dim | None, step: int
) -> list[Type]:
    d = wrap_dim(dim, x.rank, "slice")
    if step <= 0:
        raise TypeRuleError(f"slice: step must be positive, got {step}")
    length = _slice_length(x.shape[d], start, end, step)
    return [x.with_shape((*x.shape[:d], length, *x.shape[d + 1 :]))]


def _slice_ref(
    x: torch.Tensor, dim: int, start: int | None, end: int | None, step: int
) -> torch.Tensor:
    index = [slice(None)] * x.dim()
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


register(
    OpDef(
        "slice",
        Category.VIEW,
        (Param("x"),),
        (
            Attr("dim", "int", 0),
            Attr("start", "dim?", None),
            Attr("end", "dim?", None),
            Attr("step", "int", 1),
        ),
        _slice_rule,
        _slice_ref,
        ALL,
    )
)


def _select_rule(x: TensorType, dim: int, index: int) -> list[Type]:
    d = wrap_dim(dim, x.rank, "select")
    n = x.shape[d]
    if isinstance(n, int) and not -n <= index < n:
        raise TypeRuleError(f"select: index {index} out of range for dim {d} of {x}")
    return [x.with_shape((*x.shape[:d], *x.shape[d + 1 :]))]


register(
    OpDef(
        "select",
        Category.VIEW,
        (Param("x"),),
        (Attr("dim", "int"), Attr("index", "int")),
        _select_rule,
        lambda x, dim, index: x.select(dim, index),
        ALL,
    )
)

register(
    OpDef(
        "detach",
        Category.VIEW,
        (Param("x"),),
        (),
        lambda x: [x],
        lambda x: x.detach(),
        ALL,
        "identity on values; gradients do not flow through it",
    )
)

register(
    OpDef(
        "contiguous",
        Category.VIEW,
        (Param("x"),),
        (),
        lambda x: [x],
        lambda x: x.contiguous(),
        ALL,
        "identity on values; a layout request to codegen",
    )
)

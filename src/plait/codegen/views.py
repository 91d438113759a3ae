"""View ops as index maps: for an output index, the index of the input element it shows.

Views never copy in plait's kernels: an access through a view is an access to its input at a
mapped index, and a chain of views over a buffer folds into one strided (or div/mod) index.
``cat`` and ``stack`` pick one of several inputs per element, and ``constant_pad`` picks its
input or its fill value; they are lowered as selections (see :mod:`plait.codegen.lower`), not as
maps. ``pad`` (reflect, replicate, circular), ``roll`` and ``flip`` are index maps that are no
strided view of a buffer (clamps, modulo, negative strides): they are always computed inline.
Shapes are :data:`~plait.symbolic.poly.Size` tuples: with symbolic dims, index maps are
expressions of the size atoms.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> idx = (Ix.var(Var("i0", 4)), Ix.var(Var("i1", 3)))
    >>> [str(i) for i in permute_map((1, 0), idx)]
    ['i1', 'i0']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from plait.codegen.errors import CodegenError
from plait.codegen.index import Ix, ravel, unravel
from plait.errors import InternalCompilerError
from plait.ir.graph import Node, Value
from plait.ir.ops.movement import padded_dims
from plait.ir.ops.rules import wrap_dim
from plait.ir.ops.view import chunk_sizes
from plait.ir.types import TensorType
from plait.symbolic import UNBACKED_RE
from plait.symbolic.poly import (
    Poly,
    Size,
    atom_lower_bound,
    compound,
    from_dim,
    lower_bound,
)

IDENTITY_VIEWS = frozenset({"contiguous", "dropout", "detach"})  # NOTE: values unchanged
MAPPED_VIEWS = frozenset(
    {
        "view", "reshape", "flatten", "permute", "transpose", "expand", "unsqueeze", "squeeze",
        "slice", "select", "split", "chunk", "diagonal", "unfold", *IDENTITY_VIEWS,
    }
)  # fmt: skip
# NOTE: index maps that are not affine with nonnegative strides: never a strided view of a buffer.
INDEXED_VIEWS = frozenset({"pad", "roll", "flip"})
SELECT_VIEWS = frozenset({"cat", "stack", "constant_pad", *INDEXED_VIEWS})


def shape_of(t: object) -> tuple[int, ...]:
    """A static tensor type's shape (a symbolic dim raises: see :func:`sizes_of`)."""
    assert isinstance(t, TensorType)
    return tuple(int(d) for d in t.shape)


def sizes_of(t: object) -> tuple[Size, ...]:
    """A tensor type's shape as sizes: ints, and Polys for symbolic dims."""
    assert isinstance(t, TensorType)
    return tuple(d if type(d) is int else from_dim(d) for d in t.shape)


def recomputed_per_element(
    v: Value, users: Sequence[Node], layout: Callable[[Value], tuple[Size, ...]]
) -> bool:
    """Whether a kernel of one of ``users`` that inlined ``v`` would compute it again for each
    element of its innermost loop: the user reads ``v`` broadcast (its result has more elements)
    and ``v`` varies along the dim the user's result runs fastest in memory (by ``layout``, the
    planner's strides of a materialized value). Static sizes only. A value invariant there is
    hoisted out of the inner loop instead (an ``exp(b)`` per row of ``x * exp(b)``); one that
    varies is not (a squeeze-and-excitation gate's sigmoid per channel, scaling a channels_last
    map: per pixel and channel)."""
    t = v.type
    if not (isinstance(t, TensorType) and t.is_static):
        return False
    count = math.prod(int(d) for d in t.shape)
    for user in users:
        out = user.outputs[0] if user.outputs else None
        ot = out.type if out is not None else None
        if not (isinstance(ot, TensorType) and ot.is_static and t.rank <= ot.rank):
            continue
        shape = tuple(int(d) for d in ot.shape)
        if math.prod(shape) <= count:
            continue
        assert out is not None
        strides = layout(out)
        inner = len(shape) - 1
        if all(isinstance(s, int) for s in strides):
            ranked = [(s, k) for k, s in enumerate(strides) if shape[k] > 1]
            inner = min(ranked)[1] if ranked else inner
        k = inner - (ot.rank - t.rank)
        if k >= 0 and int(t.shape[k]) > 1:
            return True
    return False


def _bound(v: object) -> Size:
    """A slice or select bound of the IR (an int, or a size expression) as a size."""
    return v if isinstance(v, (int, Poly)) else from_dim(v)


def permute_map(dims: Sequence[int], idx: tuple[Ix, ...]) -> tuple[Ix, ...]:
    out: list[Ix] = [Ix.lit(0)] * len(dims)
    for k, d in enumerate(dims):
        out[d % len(dims)] = idx[k]
    return tuple(out)


def input_index(node: Node, output: int, idx: tuple[Ix, ...]) -> tuple[Ix, ...]:
    """The index into ``node``'s (single tensor) input shown at ``idx`` of output ``output``."""
    op, a = node.op, node.attrs
    x = node.inputs[0]
    in_shape = sizes_of(x.type)  # type: ignore[union-attr]
    out_shape = sizes_of(node.outputs[output].type)
    rank = len(in_shape)
    if op in IDENTITY_VIEWS:
        return idx
    if op in ("view", "reshape", "flatten"):
        if in_shape == out_shape:
            return idx
        return unravel(ravel(idx, out_shape), in_shape)
    if op == "permute":
        return permute_map(a["dims"], idx)
    if op == "transpose":
        if rank == 0:
            return idx
        d0, d1 = wrap_dim(a["dim0"], rank, op), wrap_dim(a["dim1"], rank, op)
        out = list(idx)
        out[d0], out[d1] = idx[d1], idx[d0]
        return tuple(out)
    if op == "expand":
        lead = len(out_shape) - rank
        return tuple(
            Ix.lit(0) if in_shape[j] == 1 and out_shape[lead + j] != 1 else idx[lead + j]
            for j in range(rank)
        )
    if op == "unsqueeze":
        d = wrap_dim(a["dim"], rank + 1, op)
        return idx[:d] + idx[d + 1 :]
    if op == "squeeze":
        out, k = [], 0
        for j in range(rank):
            if in_shape[j] == 1 and _squeezes(a["dims"], j, rank):
                out.append(Ix.lit(0))
            else:
                out.append(idx[k])
                k += 1
        return tuple(out)
    if op == "slice":
        d = wrap_dim(a["dim"], rank, op)
        n, first, end = in_shape[d], a["start"], a["end"]
        if isinstance(n, int) and all(v is None or isinstance(v, int) for v in (first, end)):
            start: Size = slice(first, end, a["step"]).indices(n)[0]
        else:
            # NOTE: the type rule admits nonnegative bounds only on symbolic dims; a start past
            # the end leaves no element to index
            start = 0 if first is None else _bound(first)
        return _replace(idx, d, idx[d] * a["step"] + start)
    if op == "select":
        d = wrap_dim(a["dim"], rank, op)
        n, at = in_shape[d], _bound(a["index"])
        if isinstance(n, int) and isinstance(at, int):
            index: Size = at % n if n else 0
        else:
            index = n + at if isinstance(at, int) and at < 0 else at
        return (*idx[:d], Ix.lit(index), *idx[d:])
    if op in ("split", "chunk"):
        d = wrap_dim(a["dim"], rank, op)
        # NOTE: chunk's type rule refuses a symbolic dim
        sizes = a["sizes"] if op == "split" else chunk_sizes(int(in_shape[d]), a["chunks"])
        offset: Size = 0
        for s in sizes[:output]:
            offset = offset + (int(s) if isinstance(s, int) else _bound(s))
        return _replace(idx, d, idx[d] + offset)
    if op == "diagonal":
        d1, d2 = wrap_dim(a["dim1"], rank, op), wrap_dim(a["dim2"], rank, op)
        offset = a["offset"]
        along = idx[-1]
        rest = iter(idx[:-1])
        return tuple(
            along + max(-offset, 0)
            if j == d1
            else along + max(offset, 0)
            if j == d2
            else next(rest)
            for j in range(rank)
        )
    if op == "unfold":
        if rank == 0:
            return ()
        d = wrap_dim(a["dim"], rank, op)
        return _replace(idx[:-1], d, idx[d] * a["step"] + idx[-1])
    raise InternalCompilerError(f"no index map for view op {op!r}")


def moved_index(node: Node, idx: tuple[Ix, ...]) -> tuple[Ix, ...]:
    """For ``pad``, ``roll`` and ``flip``: the index into the input shown at ``idx``.

    NOTE: each result is in range for every output index (the type rules check the pads)."""
    op, a = node.op, node.attrs
    in_shape = sizes_of(node.inputs[0].type)  # type: ignore[union-attr]
    rank = len(in_shape)
    out = list(idx)
    if op == "flip":
        # NOTE: one dim at a time: an empty dims tuple flips nothing (wrap_dims reads it as all)
        for d in {wrap_dim(dim, rank, op) for dim in a["dims"]} if rank else ():
            out[d] = idx[d] * -1 + (in_shape[d] - 1)
        return tuple(out)
    if op == "roll":
        for shift, dim in zip(a["shifts"], a["dims"]):
            d = wrap_dim(dim, rank, op)
            n = in_shape[d]
            if isinstance(n, Poly):
                # NOTE: (i - shift) mod n, kept nonnegative: n >= 1 makes n * |shift| >= |shift|
                out[d] = (out[d] - shift + (n * shift if shift > 0 else 0)).mod(n)
            elif n:
                out[d] = (out[d] + (n - shift % n)).mod(n)
        return tuple(out)
    assert op == "pad", op
    for d, lo, hi in padded_dims(rank, a["pad"]):
        out[d] = _pad_source(a["mode"], idx[d], in_shape[d], lo, hi)
    return tuple(out)


def _pad_source(mode: str, i: Ix, n: Size, lo: int, hi: int) -> Ix:
    """The input position that output position ``i`` of a dim of size ``n`` padded by
    ``(lo, hi)`` shows; negative pads crop (circular crops first, then wraps)."""
    if mode == "replicate":
        return (i - lo).clamp(0, n - 1)
    if mode == "reflect":
        j = i - lo
        # NOTE: |j| mirrors at 0 and 2(n-1) - j at n-1; pads < n, so one mirror at most.
        return j + (j * -1).clamp(0, max(lo, 0)) * 2 - (j - (n - 1)).clamp(0, max(hi, 0)) * 2
    first = max(-lo, 0)
    m = n - first - max(-hi, 0)
    if isinstance(m, int) and m <= 0:
        return Ix.lit(0)  # NOTE: nothing left to wrap: the output dim is empty
    return (i - max(lo, 0) + m).mod(m) + first


def pad_window(
    node: Node, idx: tuple[Ix, ...]
) -> tuple[tuple[Ix, ...], list[tuple[Ix, int, Size]]]:
    """For ``constant_pad``: the input index (clamped into range) and the ``(index, lo, hi)``
    conditions ``lo <= index < hi`` under which the input element, not the fill, is shown."""
    in_shape = sizes_of(node.inputs[0].type)  # type: ignore[union-attr]
    out = list(idx)
    conditions: list[tuple[Ix, int, Size]] = []
    for d, lo, hi in padded_dims(len(in_shape), node.attrs["pad"]):
        n = in_shape[d]
        _nonempty(node, n)
        out[d] = (idx[d] - lo).clamp(0, max(n - 1, 0) if isinstance(n, int) else n - 1)
        if lo > 0 or hi > 0 or n == 0:
            conditions.append((idx[d], max(lo, 0), lo + n))
    return tuple(out), conditions


def _squeezes(dims: Sequence[int] | None, j: int, rank: int) -> bool:
    return dims is None or j in {d % rank for d in dims}


def _replace(idx: tuple[Ix, ...], d: int, value: Ix) -> tuple[Ix, ...]:
    return (*idx[:d], value, *idx[d + 1 :])


# NOTE: capture specializes sizes 0 and 1, so a symbol (a size of an input dim) is at least 2,
# and each call's guards check it (plait.frontend.guard_build.symbol_guards). A graph compiled
# outside plait.compile has no guards: its runner refuses a binding below this
# (runner_emit's size check, through guarded_atom_bound).
LEAST_SYMBOLIC_SIZE = 2


def guarded_atom_bound(name: str) -> int | None:
    """The least value of size atom ``name`` under the capture's guards: a positive symbol's is
    :data:`LEAST_SYMBOLIC_SIZE`; an unbacked size (``dd0``, possibly 0) and a compound atom
    (``floor(s0/2)``) keep their own bounds (None: unknown)."""
    lo = atom_lower_bound(name)
    if lo == 1 and compound(name) is None and not UNBACKED_RE.match(name):
        return LEAST_SYMBOLIC_SIZE
    return lo


def guarded_lower_bound(x: Size) -> int | None:
    """A proven lower bound of ``x`` when every symbol is at least :data:`LEAST_SYMBOLIC_SIZE`
    (:func:`~plait.symbolic.poly.lower_bound` at :func:`guarded_atom_bound`). None: none known.

    Example:
        >>> from plait.symbolic import symbol
        >>> s1 = from_dim(symbol("s1"))
        >>> lower_bound(s1 - 1), guarded_lower_bound(s1 - 1), guarded_lower_bound(s1 - 2)
        (0, 1, 0)
    """
    return lower_bound(x, guarded_atom_bound)


def _nonempty(node: Node, n: Size) -> None:
    """NOTE: a selection loads its input at a clamped index whether or not it takes it: an input
    whose symbolic size may be 0 at run time would be read out of bounds. Refused, loudly. A
    size that is at least 1 for every size the guards admit (``s1 - 1``: ``x[1:]``,
    ``logits[:, :-1]``) is taken."""
    if isinstance(n, Poly) and (guarded_lower_bound(n) or 0) < 1:
        raise CodegenError(
            f"{node.op} of an input of symbolic size {n}, which may be 0 at run time: the "
            "Stax kernel would read it out of bounds (specialize the size)",
            node_id=node.id,
            op=node.op,
        )


def cat_pieces(
    node: Node, idx: tuple[Ix, ...]
) -> tuple[int, list[tuple[int, Size, tuple[Ix, ...]]]]:
    """For ``cat``/``stack``: the dim that selects, and per input (operand position, first output
    position along that dim, its index clamped into range)."""
    out_shape = sizes_of(node.outputs[0].type)
    pieces: list[tuple[int, Size, tuple[Ix, ...]]] = []
    if node.op == "stack":
        d = wrap_dim(node.attrs["dim"], len(out_shape), "stack")
        for j in range(len(node.inputs)):
            pieces.append((j, j, idx[:d] + idx[d + 1 :]))
        return d, pieces
    d = wrap_dim(node.attrs["dim"], len(out_shape), "cat")
    start: Size = 0
    for j, x in enumerate(node.inputs):
        shape = sizes_of(x.type)  # type: ignore[union-attr]
        if len(shape) == 1 and shape[0] == 0 and len(out_shape) != 1:
            continue
        n = shape[d]
        if n == 0:
            continue
        _nonempty(node, n)
        local = (idx[d] - start).clamp(0, n - 1)
        pieces.append((j, start, _replace(idx, d, local)))
        start += n
    return d, pieces

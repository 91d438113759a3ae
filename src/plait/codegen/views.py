"""View ops as index maps: for an output index, the index of the input element it shows.

Views never copy in plait's kernels: an access through a view is an access to its input at a
mapped index, and a chain of views over a buffer folds into one strided (or div/mod) index.
``cat`` and ``stack`` pick one of several inputs per element; they are lowered as selections
(see :mod:`plait.codegen.lower`), not as maps.

Example:
    >>> from plait.codegen.index import Ix, Var
    >>> idx = (Ix.var(Var("i0", 4)), Ix.var(Var("i1", 3)))
    >>> [str(i) for i in permute_map((1, 0), idx)]
    ['i1', 'i0']
"""

from __future__ import annotations

from collections.abc import Sequence

from plait.codegen.index import Ix, ravel, unravel
from plait.ir.graph import Node
from plait.ir.ops.rules import wrap_dim
from plait.ir.ops.view import chunk_sizes
from plait.ir.types import TensorType

IDENTITY_VIEWS = frozenset({"contiguous", "dropout"})
MAPPED_VIEWS = frozenset(
    {
        "view", "reshape", "flatten", "permute", "transpose", "expand", "unsqueeze", "squeeze",
        "slice", "select", "split", "chunk", *IDENTITY_VIEWS,
    }
)  # fmt: skip
SELECT_VIEWS = frozenset({"cat", "stack"})


def shape_of(t: object) -> tuple[int, ...]:
    assert isinstance(t, TensorType)
    return tuple(int(d) for d in t.shape)


def permute_map(dims: Sequence[int], idx: tuple[Ix, ...]) -> tuple[Ix, ...]:
    out: list[Ix] = [Ix.lit(0)] * len(dims)
    for k, d in enumerate(dims):
        out[d % len(dims)] = idx[k]
    return tuple(out)


def input_index(node: Node, output: int, idx: tuple[Ix, ...]) -> tuple[Ix, ...]:
    """The index into ``node``'s (single tensor) input shown at ``idx`` of output ``output``."""
    op, a = node.op, node.attrs
    x = node.inputs[0]
    in_shape = shape_of(x.type)  # type: ignore[union-attr]
    out_shape = shape_of(node.outputs[output].type)
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
        start = slice(a["start"], a["end"], a["step"]).indices(in_shape[d])[0]
        return _replace(idx, d, idx[d] * a["step"] + start)
    if op == "select":
        d = wrap_dim(a["dim"], rank, op)
        index = a["index"] % in_shape[d] if in_shape[d] else 0
        return (*idx[:d], Ix.lit(index), *idx[d:])
    if op in ("split", "chunk"):
        d = wrap_dim(a["dim"], rank, op)
        sizes = a["sizes"] if op == "split" else chunk_sizes(in_shape[d], a["chunks"])
        return _replace(idx, d, idx[d] + sum(int(s) for s in sizes[:output]))
    raise NotImplementedError(f"no index map for view op {op!r}")


def _squeezes(dims: Sequence[int] | None, j: int, rank: int) -> bool:
    return dims is None or j in {d % rank for d in dims}


def _replace(idx: tuple[Ix, ...], d: int, value: Ix) -> tuple[Ix, ...]:
    return (*idx[:d], value, *idx[d + 1 :])


def cat_pieces(
    node: Node, idx: tuple[Ix, ...]
) -> tuple[int, list[tuple[int, int, tuple[Ix, ...]]]]:
    """For ``cat``/``stack``: the dim that selects, and per input (operand position, first output
    position along that dim, its index clamped into range)."""
    out_shape = shape_of(node.outputs[0].type)
    pieces: list[tuple[int, int, tuple[Ix, ...]]] = []
    if node.op == "stack":
        d = wrap_dim(node.attrs["dim"], len(out_shape), "stack")
        for j in range(len(node.inputs)):
            pieces.append((j, j, idx[:d] + idx[d + 1 :]))
        return d, pieces
    d = wrap_dim(node.attrs["dim"], len(out_shape), "cat")
    start = 0
    for j, x in enumerate(node.inputs):
        shape = shape_of(x.type)  # type: ignore[union-attr]
        if len(shape) == 1 and shape[0] == 0 and len(out_shape) != 1:
            continue
        n = shape[d]
        if n == 0:
            continue
        local = (idx[d] - start).clamp(0, n - 1)
        pieces.append((j, start, _replace(idx, d, local)))
        start += n
    return d, pieces

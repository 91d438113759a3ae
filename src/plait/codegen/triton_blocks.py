"""Launch shapes of Triton kernels: the heuristic's (:func:`default_blocks`) and the candidates
autotuning times (:func:`candidate_blocks`).

Example:
    >>> pointwise_blocks(100)
    Blocks(xblock=128, rblock=0, num_warps=1, programs=1)
    >>> reduction_blocks(rows=64, row=300).rblock
    512

A symbolic kernel's launch shape is chosen at the size hints (the sizes of the call being
compiled, :func:`plait.codegen.symbolic_shapes.atom_hints`); a pointwise one takes at least
``SYMBOLIC_MIN_BLOCK`` elements per program, as its sizes may grow past the hint; a symbolic row
is reduced in chunks of ``MAX_RBLOCK``, whatever its hint. Masks and row loops cover every size,
so the hints decide speed only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plait.codegen.errors import CodegenError
from plait.codegen.kir import Kernel
from plait.codegen.loops import merge_loops
from plait.symbolic.poly import Size, evaluate

# NOTE: a program's tile: pointwise kernels take up to POINTWISE_BLOCK elements per program;
# reductions up to MAX_RBLOCK elements of a row per chunk and enough rows to fill REDUCE_TILE.
POINTWISE_BLOCK = 1024
MAX_RBLOCK = 1024
REDUCE_TILE = 2048
SYMBOLIC_MIN_BLOCK = 128


def static(n: object) -> int:
    """``n`` as an int, where a static size is needed (the bounds of a static kernel's index
    arithmetic, the buffers autotuning allocates)."""
    if not isinstance(n, int):
        raise CodegenError(f"a static size was needed, got the symbolic size {n}")
    return n


@dataclass(frozen=True)
class Blocks:
    """A launch shape: ``xblock`` outer points per program; ``rblock`` reduced elements per
    chunk (0: a pointwise kernel)."""

    xblock: int
    rblock: int
    num_warps: int
    programs: int


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _warps(elements: int) -> int:
    """One warp per 256 elements of a program's tile, 1 to 8."""
    return max(1, min(8, elements // 256))


def pointwise_blocks(n: int) -> Blocks:
    xblock = min(_pow2_at_least(n), POINTWISE_BLOCK)
    return Blocks(xblock, 0, _warps(xblock), -(-n // xblock))


def reduction_blocks(rows: int, row: int) -> Blocks:
    """Long rows: one or two rows per program, chunks of up to MAX_RBLOCK; many short rows:
    several rows per program, the whole row in one chunk."""
    rblock = min(_pow2_at_least(row), MAX_RBLOCK)
    xblock = min(_pow2_at_least(rows), max(1, REDUCE_TILE // rblock))
    return Blocks(xblock, rblock, _warps(xblock * rblock), -(-rows // xblock))


def blocks_hints(atoms: tuple[str, ...] | list[str]) -> tuple[int, ...]:
    """Representative values of size ``atoms`` (the compiling call's sizes where known)."""
    from plait.codegen.symbolic_shapes import atom_hints

    values = atom_hints(atoms)
    return tuple(values[a] for a in atoms)


def _extents(kernel: Kernel) -> tuple[int, int]:
    """Rows and row length of ``kernel`` (at the size hints where symbolic)."""
    k = merge_loops(kernel)
    atoms = kernel.size_atoms()
    values = dict(zip(atoms, blocks_hints(atoms))) if atoms else {}

    def at(x: Size) -> int:
        return max(evaluate(x, values), 0) if values else static(x)

    return math.prod(at(v.extent) for v in k.outer), math.prod(at(v.extent) for v in k.inner)


def default_blocks(kernel: Kernel) -> Blocks:
    """The heuristic's launch shape for ``kernel``."""
    rows, row = _extents(kernel)
    k = merge_loops(kernel)
    if k.inner:
        if any(not isinstance(v.extent, int) for v in k.inner):
            # NOTE: a symbolic row in the widest chunks: no lane sums more elements in sequence
            # than a static kernel's at the same length (the hint would make long rows lose
            # accuracy, not only speed)
            return reduction_blocks(rows, MAX_RBLOCK)
        return reduction_blocks(rows, row)
    if kernel.size_atoms():
        return pointwise_blocks(max(rows, SYMBOLIC_MIN_BLOCK))
    return pointwise_blocks(rows)


def candidate_blocks(kernel: Kernel) -> list[Blocks]:
    """Launch shapes worth timing for ``kernel`` (the default first): rows per program halved
    and doubled, and half the warps. NOTE: every candidate keeps the default's reduction chunk
    (``rblock``), so each row sums in the same order: all candidates compute the same bits."""
    rows, _ = _extents(kernel)
    base = default_blocks(kernel)
    most = _pow2_at_least(rows)
    xs = {base.xblock}
    if base.rblock == 0:
        xs |= {x for x in (256, 512, 1024, 2048) if x <= max(most, base.xblock)}
    else:
        xs |= {x for x in (base.xblock // 2, base.xblock * 2) if 1 <= x <= most}
    out = [base]
    for x in sorted(xs):
        warps = _warps(x * max(1, base.rblock))
        for w in sorted({warps, max(1, warps // 2)}):
            b = Blocks(x, base.rblock, w, -(-rows // x))
            if b not in out:
                out.append(b)
    return out

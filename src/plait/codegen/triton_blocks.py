"""Launch shapes of Triton kernels: the heuristic's (:func:`default_blocks`) and the candidates
autotuning times (:func:`candidate_blocks`).

Example:
    >>> pointwise_blocks(100)
    Blocks(xblock=128, rblock=0, num_warps=1, programs=1)
    >>> reduction_blocks(rows=64, row=300).rblock
    512
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plait.codegen.errors import CodegenError
from plait.codegen.kir import Kernel
from plait.codegen.loops import merge_loops

# NOTE: a program's tile: pointwise kernels take up to POINTWISE_BLOCK elements per program;
# reductions up to MAX_RBLOCK elements of a row per chunk and enough rows to fill REDUCE_TILE.
POINTWISE_BLOCK = 1024
MAX_RBLOCK = 1024
REDUCE_TILE = 2048


def static(n: object) -> int:
    """``n`` as an int: Triton kernels have static sizes (``check_graph`` refuses symbolic dims
    on the Triton target before anything is printed)."""
    if not isinstance(n, int):
        raise CodegenError(f"the Triton printer got a symbolic size {n}: static shapes only")
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


def _extents(kernel: Kernel) -> tuple[int, int]:
    k = merge_loops(kernel)
    return (
        math.prod(static(v.extent) for v in k.outer),
        math.prod(static(v.extent) for v in k.inner),
    )


def default_blocks(kernel: Kernel) -> Blocks:
    """The heuristic's launch shape for ``kernel``."""
    rows, row = _extents(kernel)
    return reduction_blocks(rows, row) if merge_loops(kernel).inner else pointwise_blocks(rows)


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

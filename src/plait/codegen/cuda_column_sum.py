"""A sum over leading dims (a bias gradient: ``(rows, columns) -> (columns,)``) on CUDA, in two
deterministic Triton stages, instead of ATen's reduction kernel.

A training step's bias and layer-norm parameter gradients are such sums (GPT-2, 6 layers: 51
a step). ATen's generic reduction ran each in 10-14 us on an H200 for a ``4096 x 768`` input
that the GPU reads in about 2 us. Here, stage one sums blocks of ``ROWS`` rows for blocks of
``COLS`` columns (one program each: a ``[RB, COLS]`` tile per step, loads coalesced along the
columns) into a float32 (float64 for float64) workspace of ``ceil(rows / ROWS)`` partial rows;
stage two sums the partial rows in order and rounds once to the result's dtype, as ATen's sum
does (it also accumulates 16-bit floats in float32). No atomics: the same input gives the same
bits on every call.

Example (the kernels run on the CPU under ``TRITON_INTERPRET=1``)::

    >>> import torch
    >>> leading_rows(torch.zeros(4, 8, 96), (0, 1))
    (32, 96, 2)
    >>> leading_rows(torch.zeros(4, 8, 96).transpose(0, 1), (0, 1)) is None
    True
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

ROWS = 128  # NOTE: rows per program of stage one: 32 partial rows for 4096 rows
RB = 32  # NOTE: rows per tile
COLS = 128  # NOTE: columns per program (256 bytes of a 16-bit row)


@triton.jit
def _partial(x_ptr, part_ptr, rows, cols, blocks, F64: tl.constexpr, ROWS: tl.constexpr,
             RB: tl.constexpr, COLS: tl.constexpr):  # fmt: skip
    """Columns ``[block * COLS, + COLS)`` of rows ``[part * ROWS, + ROWS)``, summed into partial
    row ``part``, where ``program_id(0) = part * blocks + block`` (one grid axis: a GPU's second
    holds 65535 programs, 8.4M rows of ``ROWS``)."""
    pid = tl.program_id(0).to(tl.int64)
    part = pid // blocks
    c = (pid % blocks) * COLS + tl.arange(0, COLS)
    first = part * ROWS
    r = tl.arange(0, RB)[:, None]
    acc = tl.zeros([RB, COLS], dtype=tl.float64 if F64 else tl.float32)
    for i in range(0, ROWS, RB):
        row = first + i + r
        live = (row < rows) & (c[None, :] < cols)
        x = tl.load(x_ptr + row * cols + c[None, :], mask=live, other=0.0)
        acc += x.to(tl.float64 if F64 else tl.float32)
    tl.store(part_ptr + part * cols + c, tl.sum(acc, axis=0), mask=c < cols)


@triton.jit
def _bf16(x):
    """The nearest bfloat16 of float32 ``x`` (ties to even; NaN stays NaN), by its bits: Triton's
    interpreter truncates a conversion to bfloat16, a GPU rounds it."""
    u = x.to(tl.uint32, bitcast=True)
    sixteen = tl.full([], 16, tl.uint32)
    odd = (u >> sixteen) & tl.full([], 1, tl.uint32)
    bits = (u + tl.full([], 0x7FFF, tl.uint32) + odd) >> sixteen
    bits = tl.where(x != x, tl.full([], 0x7FC0, tl.uint32), bits)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _final(part_ptr, out_ptr, cols, parts, SPAN: tl.constexpr, F64: tl.constexpr,
           BF16: tl.constexpr, COLS: tl.constexpr):  # fmt: skip
    """Columns ``[program_id(0) * COLS, + COLS)``: the ``parts`` partial rows summed in order
    (``SPAN``: a power of two at least ``parts``, so a new row count seldom compiles again)."""
    c = tl.program_id(0).to(tl.int64) * COLS + tl.arange(0, COLS)
    live = c < cols
    acc = tl.zeros([COLS], dtype=tl.float64 if F64 else tl.float32)
    row = part_ptr + c  # NOTE: a pointer stepped a row at a time: 64-bit past 2**31 elements
    for s in range(0, SPAN):
        acc += tl.load(row, mask=live & (s < parts), other=0.0)
        row += cols
    if BF16:
        tl.store(out_ptr + c, _bf16(acc), mask=live)
    else:
        tl.store(out_ptr + c, acc.to(out_ptr.dtype.element_ty), mask=live)


def leading_rows(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[int, int, int] | None:
    """``(rows, columns, lead)`` when ``dims`` are ``x``'s ``lead`` leading dims and ``x`` is
    contiguous (the rows are the leading dims flattened); None otherwise."""
    axes = sorted({d % x.dim() for d in dims}) if x.dim() else []
    if not axes or axes != list(range(len(axes))) or len(axes) == x.dim():
        return None
    if not x.is_contiguous():
        return None
    rows = math.prod(x.shape[: len(axes)])
    return rows, x.numel() // rows if rows else 0, len(axes)


def column_sum(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> Any:
    """``torch.sum(x, dims, keepdim=keepdim)`` for a contiguous floating ``x`` summed over its
    leading dims, by the two stages above; ATen's sum for any other input (a strided view)."""
    layout = leading_rows(x, dims)
    if layout is None or not x.dtype.is_floating_point or 0 in layout[:2]:
        return torch.sum(x, dims, keepdim=keepdim)
    rows, cols, lead = layout
    kept = tuple(x.shape[lead:])
    out = torch.empty((1,) * lead + kept if keepdim else kept, dtype=x.dtype, device=x.device)
    f64 = x.dtype == torch.float64
    parts = triton.cdiv(rows, ROWS)
    part = torch.empty((parts, cols), dtype=torch.float64 if f64 else torch.float32,
                       device=x.device)  # fmt: skip
    blocks = triton.cdiv(cols, COLS)
    _partial[(blocks * parts,)](x, part, rows, cols, blocks, F64=f64, ROWS=ROWS, RB=RB,
                               COLS=COLS)  # fmt: skip
    bf16 = x.dtype == torch.bfloat16
    span = 1 << (parts - 1).bit_length()
    _final[(blocks,)](part, out, cols, parts, SPAN=span, F64=f64, BF16=bf16, COLS=COLS)
    return out

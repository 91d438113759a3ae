"""A strided tensor copied into a contiguous one row by row, by a Triton kernel: the real
columns of a padded product's result (:mod:`plait.codegen.cuda_padding`; GPT-2's logits: 4,096
rows of 50,257 columns, each row in a 50,264-wide buffer) copied out of a CUDA graph
(:mod:`plait.runtime.cuda_graph_inputs`).

ATen copies such a view with its generic strided kernel, one element per index computation: on
an H200, 489 us for GPT-2's logits, where its dense copy of the whole padded buffer took about
270 us. The kernel here reads a block of one row's columns (as 16-byte vectors where the rows
are 16-byte aligned, as padded rows are) and writes it at the row's place in the contiguous
result: one program per row and block of ``BLOCK`` columns.

:func:`rows_of` says when a tensor is such a grid of rows: its last dim unit-strided, its
leading dims collapsing to evenly spaced rows.

Example (the layout test; the kernel runs on the CPU under ``TRITON_INTERPRET=1``)::

    >>> import torch
    >>> padded = torch.zeros(3, 4, 8)
    >>> rows_of(padded[..., :5]), rows_of(padded.transpose(0, 1))
    ((12, 5, 8), None)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
ALIGN_BYTES = 16
MAX_GRID_Y = 65535  # NOTE: CUDA's limit on a grid's second dimension


@triton.jit
def _copy_rows(src_ptr, dst_ptr, cols, src_row, VEC: tl.constexpr, BLOCK: tl.constexpr):
    """Row ``program_id(0)``, columns ``[program_id(1) * BLOCK, + BLOCK)``: from ``src`` (rows
    ``src_row`` elements apart, each starting ``VEC``-element aligned) to the contiguous
    ``dst``."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = j < cols
    start = tl.multiple_of(row * src_row, VEC)
    values = tl.load(src_ptr + start + j, mask=live)
    tl.store(dst_ptr + row * cols + j, values, mask=live)


def rows_of(t: torch.Tensor) -> tuple[int, int, int] | None:
    """``(rows, columns, row stride)`` of ``t`` as evenly spaced rows of unit-strided columns
    (rows at least a row long apart), or None where it is not such a grid."""
    if t.dim() == 0 or t.numel() == 0 or t.stride(-1) != 1:
        return None
    cols = t.shape[-1]
    dims = [(n, s) for n, s in zip(t.shape[:-1], t.stride()[:-1]) if n != 1]
    if not dims:
        return 1, cols, cols
    rows, row_stride = 1, dims[-1][1]
    for k, (n, s) in enumerate(dims):
        if k + 1 < len(dims) and s != dims[k + 1][1] * dims[k + 1][0]:
            return None
        rows *= n
    if row_stride < cols:
        return None
    return rows, cols, row_stride


def copy_rows(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Copy ``src`` into the contiguous ``dst`` of its shape and dtype with the kernel; False
    (nothing copied) where it does not apply: ``src`` no grid of rows (:func:`rows_of`),
    ``dst`` not contiguous, or more column blocks than a grid holds."""
    layout = rows_of(src)
    if (
        layout is None
        or not dst.is_contiguous()
        or dst.shape != src.shape
        or dst.dtype != src.dtype
        or dst.device != src.device
    ):
        return False
    rows, cols, row_stride = layout
    blocks = triton.cdiv(cols, BLOCK)
    if blocks > MAX_GRID_Y:
        return False
    size = src.element_size()
    aligned = src.data_ptr() % ALIGN_BYTES == 0 and row_stride * size % ALIGN_BYTES == 0
    vec = ALIGN_BYTES // size if aligned and ALIGN_BYTES % size == 0 else 1
    # NOTE: Triton takes a tensor's data pointer: a view's storage offset is in it
    _copy_rows[(rows, blocks)](src, dst, cols, row_stride, VEC=vec, BLOCK=BLOCK)
    return True

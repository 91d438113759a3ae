"""MKL's packed GEMM for a linear whose row count is symbolic: one pack per row count.

MKL packs a linear's weight for the row count of the calls it serves (``_mkl_reorder_linear_weight
(w, rows)``); ATen's ``_mkl_linear`` runs the packed panels only for that count (any other runs
an unpacked sgemm). With symbolic rows each call brings its own count, so the weight is packed
for each count on its first call and the packs of the last :data:`KEPT` counts are kept: a size
seen again runs packed, as a static program does. Which path computes a given row count does not
depend on the calls before it (a count is always packed before it runs), so a call's result is
the same whatever came before: MKL's packed kernel and its unpacked sgemm round differently for
small counts.

Memory: up to :data:`KEPT` packed copies of the weight, beside the weight itself. A workload
whose sizes never repeat packs on every call (about 0.9 ms for a 3072 x 768 weight on the 2-core
development machine, against 3.5 ms for the 128-row product itself).

Example:
    >>> import torch
    >>> packs = RowPacks()
    >>> w = torch.randn(8, 4)
    >>> a, b = packs(w, 3), packs(w, 5)
    >>> packs(w, 3) is a, sorted(packs.packs)
    (True, [3, 5])
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from plait.codegen.extern import ExternCall, reusable, watched, written

# NOTE: row counts whose packs are kept per weight (the least recently used is dropped)
KEPT = 4


class RowPacks:
    """A weight packed for each row count (see the module doc); rebuilt when the weight tensor
    is replaced or written in place (identity, version counter and address:
    :func:`~plait.codegen.extern.written`), and at every call where it is not ``reuse``-able
    (:func:`~plait.codegen.extern.reusable`: a weight the program computes)."""

    def __init__(self, reuse: bool = True, watch: bool = False) -> None:
        self.reuse, self.watch = reuse, watch
        self.source: torch.Tensor | None = None
        self.version: tuple[int, int, bytes | None] = (-1, 0, None)
        self.packs: OrderedDict[int, torch.Tensor] = OrderedDict()

    def __call__(self, w: torch.Tensor, rows: int) -> torch.Tensor:
        if w is not self.source or written(w, self.watch) != self.version or not self.reuse:
            self.packs.clear()
            self.source, self.version = w, written(w, self.watch)
        hit = self.packs.get(rows)
        if hit is None:
            hit = torch.ops.mkl._mkl_reorder_linear_weight(w.contiguous(), rows)
            self.packs[rows] = hit
            if len(self.packs) > KEPT:
                self.packs.popitem(last=False)
        else:
            self.packs.move_to_end(rows)
        return hit


def mkl_rows_call(node: Any, consts: Mapping[Any, torch.Tensor], hint_rows: int) -> ExternCall:
    """A float32 linear of symbolic row count, without post-ops, through MKL's packed GEMM:
    packed per row count (:class:`RowPacks`); a constant weight is packed for ``hint_rows`` (the
    compiling call's) at compile time."""
    packs = RowPacks(reusable(node.inputs[1]), watched(node.inputs[1]))
    fixed = consts.get(node.inputs[1])
    if fixed is not None:
        packs(fixed, hint_rows)
    compute = torch.ops.mkl._mkl_linear.default

    def fn(x: Any, w: Any, b: Any) -> Any:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return compute(x, packs(w, rows), w, b, rows)

    detail = f"MKL packed linear (weight packed per row count, the last {KEPT} kept)"
    return ExternCall(fn, "matmul", detail, "MKL")

"""Reductions the TVM printer (:mod:`plait.codegen.tvm_script`) accumulates in vector lanes
itself (which reductions: :func:`plait.codegen.tvm_vector.reduction_lanes`).

A vector block over chunks of the innermost reduced variable keeps one partial per lane in
``acc<n>_lanes`` (its values vectors: libmvec's functions, broadcast earlier reductions), each
lane starting from the reduction's identity; then blocks combine the lanes pairwise, halving,
each into a buffer of its own (``acc<n>_lanes<half>``: a block that rewrote what it read would
not be a complete block, and TensorIR would refuse the parallel outer loop), the last pair into
``acc<n>``. A sum adds in lane order and then pairwise, an order the numerical contract's
reduction rows allow; a float max or min is one pass with no NaN flag
(:func:`plait.codegen.tvm_scalar.nan_extremum`: NaN propagates, infinities are kept, since the
lanes start from the infinity rather than TensorIR's lowest finite value).

The printer prints such a kernel fused (:attr:`plait.codegen.tvm_script.TvmSource.fused`): the
schedule's ``compute_at`` misjudges the vector regions of these blocks.

Example:
    >>> from plait.codegen.kir import Reduce, Stmt
    >>> r = Reduce(0, "max", Stmt(1, "load", (), "f32"), "f32")
    >>> step(r, "a", "v").startswith("T.Select(T.isnan(v), v, ")
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

from plait.codegen.index import Var
from plait.codegen.kir import Kernel, Reduce, Stmt
from plait.codegen.tvm_scalar import combine, const_text, identity, nan_extremum, vector_lanes


class LanesPrinter(Protocol):
    """What of the TVM printer the lanes' blocks use."""

    k: Kernel
    red_lanes: dict[int, int]
    block_names: list[str]

    def line(self, depth: int, text: str) -> None: ...
    def vector(self, lanes: int, var: Var | None) -> contextlib.AbstractContextManager[None]: ...
    def loops(self, depth: int, inner: bool) -> int: ...
    def axes(self, depth: int, inner: str | None) -> None: ...
    def emit(self, depth: int, roots: list[Stmt]) -> None: ...
    def operand(self, s: Stmt, memo: dict[int, str] | None = None) -> str: ...
    def acc_ref(self, n: int, suffix: str = "") -> str: ...


def step(r: Reduce, acc: str, v: str) -> str:
    """One step of ``r`` in lanes: ``acc`` and ``v`` combined."""
    if r.kind in ("max", "min"):
        return nan_extremum(r.kind, r.dtype, acc, v)
    return combine(r, acc, v)


def lanes_buffers(r: Reduce, lanes: int) -> Sequence[tuple[str, int]]:
    """The buffers of ``r``'s lanes and combines, names and lanes (none for 1 lane)."""
    if lanes <= 1:
        return []
    out, n = [(f"acc{r.acc}_lanes", lanes)], lanes // 2
    while n > 1:
        out.append((f"acc{r.acc}_lanes{n}", n))
        n //= 2
    return out


def lanes_reduction(p: LanesPrinter, depth: int, name: str, r: Reduce) -> None:
    """Print ``r``'s vector block (``<name>_vector<lanes>``) and its combines
    (``<name>_combine<half>``)."""
    lanes, n = p.red_lanes[r.acc], r.acc
    outer = ", ".join(v.name for v in p.k.outer) or "0"
    part = f"acc{n}_lanes[{outer}, T.Ramp(0, 1, {lanes})]"
    with p.vector(lanes, p.k.inner[-1]):
        d = p.loops(depth, inner=True)
        p.line(d, f'with T.sblock("{name}_vector{lanes}"):')
        p.block_names.append(f"{name}_vector{lanes}")
        p.axes(d + 1, "reduce")
        p.line(d + 1, "with T.init():")
        p.line(d + 2, f"{part} = {const_text(identity(r.kind, r.dtype), r.dtype)}")
        p.emit(d + 1, [r.value])
        p.line(d + 1, f"{part} = {step(r, part, p.operand(r.value))}")
    half, src = lanes // 2, f"acc{n}_lanes"
    while half >= 1:
        d = p.loops(depth, inner=False)
        p.line(d, f'with T.sblock("{name}_combine{half}"):')
        p.block_names.append(f"{name}_combine{half}")
        p.axes(d + 1, None)
        if half == 1:
            lo, hi, to = f"{src}[{outer}, 0]", f"{src}[{outer}, 1]", p.acc_ref(n)
        else:
            lo = f"{src}[{outer}, T.Ramp(0, 1, {half})]"
            hi = f"{src}[{outer}, T.Ramp({half}, 1, {half})]"
            to = f"acc{n}_lanes{half}[{outer}, T.Ramp(0, 1, {half})]"
        with vector_lanes(half):
            p.line(d + 1, f"{to} = {step(r, lo, hi)}")
        half, src = half // 2, f"acc{n}_lanes{half}"

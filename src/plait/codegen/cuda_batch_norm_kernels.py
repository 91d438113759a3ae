"""Triton kernels of training-mode batch norm over a contiguous ``(N, C, L)`` tensor (``L`` the
flattened spatial dims), float32 accumulation whatever the input's dtype.

Every per-channel reduction runs in two stages so that a few channels over many elements still
fill the GPU: stage one, a grid of ``(C, S)`` programs, each reducing rows ``n`` of one split of
the batch (``ROWS`` rows each) as ``[RB, LB]`` tiles into per-lane float32 accumulators; stage
two (``_finalize_*``, one program per block of channels) combines the ``S`` partial results in
split order. Nothing is atomic, so a result depends on the shapes alone (deterministic).

Statistics: each split's sums are taken about a shift, the mean of its first tile (shifted sums:
the variance's rounding error is that of the deviations from the shift, not of the values), and
the splits are combined by Chan's pairwise formula (count, mean, sum of squared deviations). A
NaN or infinity reaches the channel's mean and variance as in eager's CUDA kernel, whose threads
run Welford's update: the variance NaN; the mean NaN, but +-inf where there is no NaN and every
infinity is of that sign and the last value its thread reads (``cuda_batch_norm.last_reads``; a
split holding an infinity reads itself again to find that, finite data never do). The
elementwise kernels compute eager's expressions: ``(x - mean) * (rstd * w) + b`` and
``(g - sum_g / n - (x - mean) * (sum_gx / n * rstd^2)) * (rstd * w)``. A batch norm fused with
its ReLU (``plait.passes.fuse_bn_relu``) applies the ReLU to the rounded result as it stores it,
and its backward the ReLU's mask to ``g`` as each kernel reads it.

Offsets are int32: the caller passes tensors of fewer than 2^30 values (a masked lane's offset
runs at most a tile past the end).
"""

from __future__ import annotations

import importlib
from typing import Any

import triton
import triton.language as tl

from plait.codegen.triton_load import interpreting

# NOTE: IEEE division and square root (Triton's float32 ``/`` is approximate on the GPU):
# libdevice's, or the numpy shim's where Triton interprets
FLT_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)  # NOTE: finite means |v| <= it
# NOTE: float32 NaN from its bits (a NaN constant would fail Triton's check that globals are
# unchanged: NaN != NaN)
NAN_BITS: tl.constexpr = tl.constexpr(0x7FC00000)
M: Any = importlib.import_module(
    "plait.codegen.triton_interp" if interpreting() else "triton.language.extra.cuda.libdevice"
)


@triton.jit
def _moments(
    x_ptr, part_ptr, C, N, ROW_LAST, COL_LAST,
    L: tl.constexpr, ROWS: tl.constexpr, RB: tl.constexpr, LB: tl.constexpr,
):  # fmt: skip
    """Split ``s`` of channel ``c``: (its mean, its sum of squared deviations) at
    ``part[(s * C + c) * 2]``; the mean NaN where an infinity of the split lies before row
    ``ROW_LAST`` or column ``COL_LAST`` (eager's Welford loop, :func:`_early_infinity`)."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    n0 = s * ROWS
    n1 = tl.minimum(n0 + ROWS, N)
    r = tl.arange(0, RB)[:, None]
    j = tl.arange(0, LB)[None, :]
    first = ((n0 + r) < n1) & (j < L)
    at = (n0 + r) * C * L + c * L + j
    x0 = tl.load(x_ptr + at, mask=first, other=0.0).to(tl.float32)
    shift = M.div_rn(
        tl.sum(tl.sum(x0, axis=1), axis=0), tl.sum(tl.sum(first.to(tl.float32), axis=1), axis=0)
    )
    # NOTE: an infinite or NaN shift would turn an infinite mean into NaN (inf - inf): the
    # plain sums then give +-inf (NaN for both signs or a NaN), eager's where its threads read
    # each infinity last
    shift = tl.where(tl.abs(shift) <= FLT_MAX, shift, 0.0)
    s1 = tl.zeros([RB, LB], dtype=tl.float32)
    s2 = tl.zeros([RB, LB], dtype=tl.float32)
    for i in range(0, ROWS, RB):
        nb = n0 + i
        live = (nb + r) < n1
        base = (nb + r) * C * L + c * L
        for lb in range(0, L, LB):
            m = live & ((lb + j) < L)
            v = tl.load(x_ptr + base + lb + j, mask=m, other=0.0).to(tl.float32)
            d = tl.where(m, v - shift, 0.0)
            s1 += d
            s2 += d * d
    count = ((n1 - n0) * L).to(tl.float32)
    t1 = tl.sum(tl.sum(s1, axis=1), axis=0)
    t2 = tl.sum(tl.sum(s2, axis=1), axis=0)
    m2 = t2 - t1 * M.div_rn(t1, count)
    m2 = tl.where(m2 < 0.0, 0.0, m2)  # NOTE: rounding only; a NaN stays (NaN < 0 is false)
    mean = shift + M.div_rn(t1, count)
    if tl.abs(t1) > FLT_MAX:
        # NOTE: infinities of one sign and no NaN (else t1 is NaN, and so the mean): read again
        # for one that eager's thread reads before its last value (never on finite data)
        early = _early_infinity(x_ptr, C, n0, n1, c, ROW_LAST, COL_LAST, L, ROWS, RB, LB)
        mean = tl.where(early, tl.full([], NAN_BITS, tl.int32).to(tl.float32, bitcast=True), mean)
    tl.store(part_ptr + (s * C + c) * 2, mean)
    tl.store(part_ptr + (s * C + c) * 2 + 1, m2)


@triton.jit
def _early_infinity(
    x_ptr, C, n0, n1, c, ROW_LAST, COL_LAST,
    L: tl.constexpr, ROWS: tl.constexpr, RB: tl.constexpr, LB: tl.constexpr,
):  # fmt: skip
    """Whether rows ``[n0, n1)`` of channel ``c`` hold an infinity at a row before
    ``ROW_LAST`` or a column before ``COL_LAST``: one that eager's CUDA statistics kernel reads
    before its thread's last value, whose Welford update then makes the thread's mean NaN
    (``inf + (v - inf) / n``), and so the channel's (``cuda_batch_norm.last_reads``)."""
    r = tl.arange(0, RB)[:, None]
    j = tl.arange(0, LB)[None, :]
    seen = tl.zeros([RB, LB], dtype=tl.int32)
    for i in range(0, ROWS, RB):
        row = n0 + i + r
        live = row < n1
        for lb in range(0, L, LB):
            m = live & ((lb + j) < L)
            v = tl.load(x_ptr + row * C * L + c * L + lb + j, mask=m, other=0.0).to(tl.float32)
            early = (row < ROW_LAST) | ((lb + j) < COL_LAST)
            seen = seen | (m & early & (tl.abs(v) > FLT_MAX)).to(tl.int32)
    return tl.max(tl.max(seen, axis=1), axis=0) > 0


@triton.jit
def _finalize_moments(
    part_ptr, mean_ptr, rstd_ptr, rm_ptr, rv_ptr, new_rm_ptr, new_rv_ptr,
    C, L, N, eps, momentum,
    ROWS: tl.constexpr, S: tl.constexpr, RUNNING: tl.constexpr, CB: tl.constexpr,
):  # fmt: skip
    """Chan's combination of the splits' moments, in split order: the batch mean, the inverse
    standard deviation ``1 / sqrt(biased var + eps)``, and (``RUNNING``) the running statistics
    moved by ``momentum`` towards the mean and the unbiased variance."""
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    live = c < C
    mean = tl.load(part_ptr + c * 2, mask=live, other=0.0)
    m2 = tl.load(part_ptr + c * 2 + 1, mask=live, other=0.0)
    n_a = (tl.minimum(N, ROWS) * L).to(tl.float32)
    for s in range(1, S):  # NOTE: split order, whatever the launch order
        n_b = ((tl.minimum(N, s * ROWS + ROWS) - s * ROWS) * L).to(tl.float32)
        mean_b = tl.load(part_ptr + (s * C + c) * 2, mask=live, other=0.0)
        m2_b = tl.load(part_ptr + (s * C + c) * 2 + 1, mask=live, other=0.0)
        total = n_a + n_b
        delta = mean_b - mean
        # NOTE: with an infinite mean, Chan's update gives NaN (inf - inf); the weighted sum
        # gives eager's +-inf (and NaN for both signs, as eager's running update does)
        finite = (tl.abs(mean) <= FLT_MAX) & (tl.abs(mean_b) <= FLT_MAX)
        weighted = M.div_rn(mean * n_a + mean_b * n_b, total)
        mean = tl.where(finite, mean + delta * M.div_rn(n_b, total), weighted)
        m2 = m2 + m2_b + delta * delta * (n_a * M.div_rn(n_b, total))
        n_a = total
    var = M.div_rn(m2, n_a + tl.zeros([CB], tl.float32))
    rstd = M.div_rn(tl.full([CB], 1.0, tl.float32), M.sqrt_rn(var + eps))
    # NOTE: eager's InvStd: 0 where the variance and eps are both 0
    rstd = tl.where((var == 0.0) & (eps == 0.0), 0.0, rstd)
    tl.store(mean_ptr + c, mean, mask=live)
    tl.store(rstd_ptr + c, rstd, mask=live)
    if RUNNING:
        rm = tl.load(rm_ptr + c, mask=live, other=0.0).to(tl.float32)
        rv = tl.load(rv_ptr + c, mask=live, other=0.0).to(tl.float32)
        unbiased = M.div_rn(m2, n_a - 1.0 + tl.zeros([CB], tl.float32))
        tl.store(new_rm_ptr + c, momentum * mean + (1.0 - momentum) * rm, mask=live)
        tl.store(new_rv_ptr + c, momentum * unbiased + (1.0 - momentum) * rv, mask=live)


@triton.jit
def _normalize(
    x_ptr, y_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, C, L, rows_total,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, RELU: tl.constexpr,
    RB: tl.constexpr, LB: tl.constexpr,
):  # fmt: skip
    """``y = (x - mean) * (rstd * w) + b`` over ``[RB, LB]`` tiles of the ``(N * C, L)`` rows;
    ``RELU``: ``relu`` of ``y`` rounded to its dtype."""
    row = tl.program_id(0) * RB + tl.arange(0, RB)
    j = tl.program_id(1) * LB + tl.arange(0, LB)
    live = row < rows_total
    c = row % C
    mean = tl.load(mean_ptr + c, mask=live, other=0.0)
    scale = tl.load(rstd_ptr + c, mask=live, other=0.0)
    if HAS_W:
        scale = scale * tl.load(w_ptr + c, mask=live, other=0.0).to(tl.float32)
    m = live[:, None] & (j < L)[None, :]
    at = row[:, None] * L + j[None, :]
    x = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
    y = (x - mean[:, None]) * scale[:, None]
    if HAS_B:
        y = y + tl.load(b_ptr + c, mask=live, other=0.0).to(tl.float32)[:, None]
    y = y.to(y_ptr.dtype.element_ty)
    if RELU:
        # NOTE: eager's relu of the rounded value, ``y < 0 ? 0 : y``: NaN and -0.0 pass
        y = tl.where(y < 0.0, 0.0, y).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + at, y, mask=m)


@triton.jit
def _masked(g, y_ptrs, m):
    """The ReLU's derivative rule on ``g``: ``where(le(y, 0), 0.0, g)`` (eager's
    threshold_backward; a NaN y passes g), y read at ``y_ptrs`` in its own dtype."""
    y = tl.load(y_ptrs, mask=m, other=0.0)
    return tl.where(y <= 0.0, 0.0, g)


@triton.jit
def _grad_sums(
    g_ptr, y_ptr, x_ptr, mean_ptr, part_ptr, C, N,
    L: tl.constexpr, ROWS: tl.constexpr, MASKED: tl.constexpr, RB: tl.constexpr,
    LB: tl.constexpr,
):  # fmt: skip
    """Split ``s`` of channel ``c``: (sum of g, sum of g * (x - mean)) at
    ``part[(s * C + c) * 2]``; ``MASKED``: of g masked by the ReLU result y (:func:`_masked`)."""
    c = tl.program_id(0)
    s = tl.program_id(1)
    n0 = s * ROWS
    n1 = tl.minimum(n0 + ROWS, N)
    r = tl.arange(0, RB)[:, None]
    j = tl.arange(0, LB)[None, :]
    mean = tl.load(mean_ptr + c)
    sg = tl.zeros([RB, LB], dtype=tl.float32)
    sgx = tl.zeros([RB, LB], dtype=tl.float32)
    for i in range(0, ROWS, RB):
        nb = n0 + i
        live = (nb + r) < n1
        base = (nb + r) * C * L + c * L
        for lb in range(0, L, LB):
            m = live & ((lb + j) < L)
            g = tl.load(g_ptr + base + lb + j, mask=m, other=0.0).to(tl.float32)
            if MASKED:
                g = _masked(g, y_ptr + base + lb + j, m)
            x = tl.load(x_ptr + base + lb + j, mask=m, other=0.0).to(tl.float32)
            sg += g
            sgx += g * tl.where(m, x - mean, 0.0)
    tl.store(part_ptr + (s * C + c) * 2, tl.sum(tl.sum(sg, axis=1), axis=0))
    tl.store(part_ptr + (s * C + c) * 2 + 1, tl.sum(tl.sum(sgx, axis=1), axis=0))


@triton.jit
def _finalize_grads(
    part_ptr, rstd_ptr, w_ptr, dw_ptr, db_ptr, coef_ptr, C, L, N,
    S: tl.constexpr, HAS_W: tl.constexpr, CB: tl.constexpr,
):  # fmt: skip
    """The splits' sums added in split order: ``dw = sum_gx * rstd``, ``db = sum_g``, and the
    input gradient's per-channel coefficients ``(sum_g / n, sum_gx / n * rstd^2, rstd * w)`` at
    ``coef[c * 3]``."""
    c = tl.program_id(0) * CB + tl.arange(0, CB)
    live = c < C
    sg = tl.load(part_ptr + c * 2, mask=live, other=0.0)
    sgx = tl.load(part_ptr + c * 2 + 1, mask=live, other=0.0)
    for s in range(1, S):
        sg += tl.load(part_ptr + (s * C + c) * 2, mask=live, other=0.0)
        sgx += tl.load(part_ptr + (s * C + c) * 2 + 1, mask=live, other=0.0)
    rstd = tl.load(rstd_ptr + c, mask=live, other=0.0)
    count = (N * L).to(tl.float32)
    scale = rstd
    if HAS_W:
        scale = rstd * tl.load(w_ptr + c, mask=live, other=0.0).to(tl.float32)
        tl.store(dw_ptr + c, sgx * rstd, mask=live)
        tl.store(db_ptr + c, sg, mask=live)
    count = count + tl.zeros([CB], tl.float32)
    tl.store(coef_ptr + c * 3, M.div_rn(sg, count), mask=live)
    tl.store(coef_ptr + c * 3 + 1, M.div_rn(sgx, count) * (rstd * rstd), mask=live)
    tl.store(coef_ptr + c * 3 + 2, scale, mask=live)


@triton.jit
def _grad_input(
    g_ptr, y_ptr, x_ptr, mean_ptr, coef_ptr, dx_ptr, C, L, rows_total,
    MASKED: tl.constexpr, RB: tl.constexpr, LB: tl.constexpr,
):  # fmt: skip
    """``dx = (g - sum_g / n - (x - mean) * proj) * (rstd * w)`` over ``[RB, LB]`` tiles;
    ``MASKED``: g masked by the ReLU result y (:func:`_masked`)."""
    row = tl.program_id(0) * RB + tl.arange(0, RB)
    j = tl.program_id(1) * LB + tl.arange(0, LB)
    live = row < rows_total
    c = row % C
    mean = tl.load(mean_ptr + c, mask=live, other=0.0)
    mean_g = tl.load(coef_ptr + c * 3, mask=live, other=0.0)
    proj = tl.load(coef_ptr + c * 3 + 1, mask=live, other=0.0)
    scale = tl.load(coef_ptr + c * 3 + 2, mask=live, other=0.0)
    m = live[:, None] & (j < L)[None, :]
    at = row[:, None] * L + j[None, :]
    g = tl.load(g_ptr + at, mask=m, other=0.0).to(tl.float32)
    if MASKED:
        g = _masked(g, y_ptr + at, m)
    x = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
    dx = (g - mean_g[:, None] - (x - mean[:, None]) * proj[:, None]) * scale[:, None]
    tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=m)

"""Eager's CUDA training-mode batch norm where it is not ATen's CPU kernel, emulated on the CPU,
and draws that write NaN, infinities and -0.0 where they tell the two apart.

ATen's CPU kernel takes the batch mean as ``sum / n``; its CUDA statistics kernels
(``Normalization.cuh``) run Welford's update in each thread over the values it reads, in its
order, and merge the threads' ``(count, mean, m2)``. An infinity then reaches the CUDA mean only
where it is the last value its thread reads (the next one, or the channels-last kernel's next
masked step, gives ``inf - inf``). :func:`cuda_batch_mean` replays those threads; its float32
rounding is not bitwise the kernel's (the merge order), its NaN and infinities are. The normalized
output follows CUDA's algebra, ``w * (x - mean) * invstd + b``, not the CPU kernel's
``x * alpha + beta`` (apart at an infinite weight). Imports nothing of plait's kernels.
"""

from __future__ import annotations

import torch

from tests.util import contract_tol

MOMENTUM, EPS = 0.1, 1e-5
NAN, INF = float("nan"), float("inf")
# NOTE: (N, C, spatial...), C >= 6 for special_draw: ATen's NCHW kernel at 128 x 4 threads,
# 512 x 1 (two of plait's splits), 32 x 16; a 2-D input runs its channels-last kernel, one
# step of 4 loads (N = 9), several (N = 40)
SHAPES = [(5, 6, 9, 11), (16, 6, 32, 32), (3, 6, 2, 3, 4), (9, 6), (40, 6)]


def _last_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def assert_same_values(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """NaN and infinities (with their signs) at the same positions; the finite values within
    the contract's normalization row."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN at {got}, not {want}"
    inf = want.isinf()
    assert torch.equal(got.isinf(), inf) and torch.equal(got[inf], want[inf]), what
    finite = want.isfinite()
    torch.testing.assert_close(
        got[finite], want[finite], **contract_tol("normalization", want.dtype), msg=what
    )


def cuda_batch_mean(x: torch.Tensor) -> torch.Tensor:
    """The float32 batch mean that ATen's CUDA statistics kernel gives for contiguous ``x``.

    Length > 1 per channel row: ``batch_norm_collect_statistics_kernel``, ``tf x 512 / tf``
    threads, thread ``(i, j)`` reading rows ``j + k * 512 / tf``, in each columns ``i + q * tf``.
    Length 1 (``(N, C)``: stride 1 between channels): the channels-last kernel, ``by * gy``
    threads down the rows, each with 4 Welford slots, slot ``l`` of step ``s`` reading row
    ``t + (4 * s + l) * by * gy``, every slot running every step (a row past the end read as 0
    with weight 0)."""
    n, c = x.shape[:2]
    length = x.numel() // (n * c)
    v = x.reshape(n, c, length).float()
    if length > 1:
        tf = next((t for t in (32, 64, 128, 256) if length <= t), 512)
        by = max(1, 512 // tf)
        nb, nx = _ceil(n, by), _ceil(length, tf)
        pad = torch.zeros(nb * by, c, nx * tf)
        ok = torch.zeros(nb * by, c, nx * tf, dtype=torch.bool)
        pad[:n, :, :length], ok[:n, :, :length] = v, True
        # NOTE: (k, j, c, q, i) -> (c, thread (j, i), step (k, q))
        order = (2, 1, 4, 0, 3)
        seq = pad.view(nb, by, c, nx, tf).permute(order).reshape(c, by * tf, nb * nx)
        valid = ok.view(nb, by, c, nx, tf).permute(order).reshape(c, by * tf, nb * nx)
        masked_steps = False
    else:
        bx = min(_last_pow2(c), 32)
        by = min(_last_pow2(_ceil(n, 16)), 512 // bx)
        gy = min(_ceil(n, by * 16), 128)
        threads = by * (gy if gy >= 8 else 1)
        steps = 1 + (n - 1) // (threads * 4)
        pad = torch.zeros(steps * 4 * threads, c)
        ok = torch.zeros(steps * 4 * threads, c, dtype=torch.bool)
        pad[:n], ok[:n] = v[:, :, 0], True
        # NOTE: row t + (4 * s + l) * threads: (s, l, t, c) -> (c, slot (l, t), step s)
        seq = pad.view(steps, 4, threads, c).permute(3, 1, 2, 0).reshape(c, 4 * threads, steps)
        valid = ok.view(steps, 4, threads, c).permute(3, 1, 2, 0).reshape(c, 4 * threads, steps)
        masked_steps = True
    mean = torch.zeros(seq.shape[:2])
    count = torch.zeros(seq.shape[:2])
    for k in range(seq.shape[2]):
        val, live = seq[..., k], valid[..., k]
        if masked_steps:  # NOTE: mean += (x - mean) * (1 / count), x and 1 / count 0 if masked
            count = count + live
            inv = torch.where(live, 1.0 / count.clamp(min=1), 0.0)
            mean = mean + (torch.where(live, val, 0.0) - mean) * inv
        else:  # NOTE: mean += (x - mean) / count, for the values the thread reads
            count = count + live
            mean = torch.where(live, mean + (val - mean) / count.clamp(min=1), mean)
    merged = (count.double() * mean.double()).sum(1) / (n * length)
    return merged.float()


def cuda_forward(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    rm: torch.Tensor,
    rv: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """``_native_batch_norm_legit_functional``'s results as eager's CUDA kernels give them:
    the mean of :func:`cuda_batch_mean`; the variance ATen's CPU kernel's (NaN wherever the
    channel holds a NaN or an infinity, as Welford's ``m2``); the output by CUDA's algebra."""
    cpu = torch.ops.aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, MOMENTUM, EPS)
    _, _, invstd, _, new_rv = cpu
    mean = cuda_batch_mean(x)
    shape = [1, -1] + [1] * (x.dim() - 2)

    def per(t: torch.Tensor) -> torch.Tensor:
        return t.float().view(shape)

    y = (per(w) * (x.float() - per(mean)) * per(invstd) + per(b)).to(x.dtype)
    new_rm = (mean * MOMENTUM + (1 - MOMENTUM) * rm.float()).to(rm.dtype)
    return y, mean, invstd, new_rm, new_rv


def draw(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``(x, w, b, rm, rv, gy)``, fresh and finite: ``x`` with a mean far from zero per channel,
    ``gy`` correlated with ``x`` (a channel's gradient sums then do not cancel: two float32
    orders of a cancelling sum differ beyond the contract's row)."""
    g = torch.Generator().manual_seed(seed)
    c = shape[1]
    z = torch.randn(shape, generator=g)
    x = z * 2 + torch.randn(c, generator=g).view(1, c, *[1] * (len(shape) - 2)) * 5
    w, b, rm = (torch.randn(c, generator=g) for _ in range(3))
    rv = torch.rand(c, generator=g) + 0.5
    gy = torch.randn(shape, generator=g) * 0.5 + z + 1.0
    return x.to(dtype), w, b, rm, rv, gy.to(dtype)


def special_draw(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """:func:`draw`'s values with, in ``x``: channel 0 ``+inf`` at its last value (read last by
    every CUDA thread layout), channel 1 ``-inf`` at a random position, channel 2 ``+inf`` and
    ``-inf``, channel 3 all NaN, -0.0 at a random position of channel 5; an infinite weight and
    bias on the finite channels 4 and 5, NaN and ``+inf`` in the running statistics there, and
    ``+inf`` and NaN in ``gy``."""
    x, w, b, rm, rv, gy = (t.float() for t in draw(seed, shape, torch.float32))
    g = torch.Generator().manual_seed(seed + 1000)
    n, c = shape[:2]
    assert c >= 6, shape
    rows = x.view(n, c, -1)
    length = rows.shape[2]

    def anywhere() -> tuple[int, int]:
        k = int(torch.randint(n * length, (1,), generator=g))
        return k // length, k % length

    rows[n - 1, 0, length - 1] = INF
    (i, j), (k, m) = anywhere(), anywhere()
    rows[i, 1, j] = -INF
    rows[i, 2, j], rows[k, 2, m] = INF, -INF
    if (i, j) == (k, m):
        rows[(i + 1) % n, 2, j] = INF
    rows[k, 5, m] = -0.0
    w[4], b[5], rm[4], rv[5] = INF, -INF, NAN, INF
    g_rows = gy.view(n, c, -1)
    g_rows[i, 4, j], g_rows[k, 5, m] = INF, NAN
    return x.to(dtype), w, b, rm, rv, gy.to(dtype)

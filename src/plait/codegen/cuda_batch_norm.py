"""Training-mode batch norm on CUDA as plait's own Triton kernels
(:mod:`plait.codegen.cuda_batch_norm_kernels`) instead of ATen's.

A training program runs batch norm as ATen's functional call, and its backward as
``native_batch_norm_backward`` reading the saved batch mean and inverse standard deviation
(``plait.autograd.joint``). On CUDA both nodes run these kernels instead, same arguments, same
results (the normalized input, the float32 batch mean and inverse standard deviation, the
running statistics moved by ``momentum`` towards the mean and the unbiased variance; the input,
weight and bias gradients): ATen's NCHW kernels reduce each channel in one block of threads,
which leaves most of an H200 idle for the wide activations and few channels of a ResNet's first
stages (50% of a ResNet-50 bf16 training step's GPU time). Here each per-channel reduction is
split over the batch (:func:`splits`), so that ``C * S`` programs fill the GPU, and combined in
a second, deterministic stage.

The kernels take a contiguous input of rank 2 or more in float32, bfloat16 or float16, with
float32 statistics; a call they do not take (another layout or dtype, one value per channel,
an evaluation-mode backward) runs ATen's kernel, decided per call. Results are within the
contract's normalization row of eager's, not bitwise: the sums run in another order.

The same calls run a batch norm fused with its ReLU (``batch_norm_relu``,
``batch_norm_relu_backward``: :mod:`plait.passes.fuse_bn_relu`): the normalize kernel stores
``relu`` of its result, the backward kernels mask the gradient by the ReLU's result as they read
it; a call the kernels do not take runs ATen's kernel with the ReLU after it (the mask before it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from plait.codegen.extern_call import ExternCall
from plait.ir.graph import Node, Value
from plait.ir.ops.batch_norm_relu import BACKWARD, FORWARD, bound_slots
from plait.ir.types import TensorType

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DETAIL = (
    "plait Triton batch norm ({}: per-channel sums split over the batch; ATen's kernel for an "
    "input that is not contiguous)"
)
ATEN = "aten.{}.{} ({}; plait's kernels take float32, bfloat16 and float16 of rank 2 or more)"
# NOTE: the ops of plait.passes.fuse_bn_relu, with what their detail adds
FUSED = {
    "batch_norm_relu": " with the ReLU fused",
    "batch_norm_relu_backward": " with the ReLU's mask fused",
}
# NOTE: stage one's programs: about two waves of 8 per SM on an H200 (132 SMs), each summing at
# least a tile of values
PROGRAMS, MIN_SPLIT = 2048, 2048
# NOTE: values per tile (RB rows of LB) and the longest row part of one, for the reductions
# (stage one) and the elementwise kernels. On an H200, ResNet-50's 53 batch norms at batch 64
# (bf16) took 1.96 ms forward and 2.40 ms backward so, in CUDA graphs; tiles of 4096 or 8192
# values and 1024 or 4096 stage-one programs took 4.5-5.0 ms together (ATen's: 14.8 ms)
REDUCE_TILE, REDUCE_ROW = 2048, 1024
ELEMENT_TILE, ELEMENT_ROW = 2048, 1024


def batch_norm_call(node: Node) -> ExternCall | None:
    """The call for an ATen batch-norm node of a training program, or for one fused with its
    ReLU (``batch_norm_relu``, ``batch_norm_relu_backward``: always a call, ATen's kernel and
    the ReLU where the kernels cannot take it); None for other nodes."""
    fused = node.op in FUSED
    if node.op != "aten" and not fused:
        return None
    key = (node.attrs["name"], node.attrs["overload"])
    if key not in FORWARD and key != BACKWARD:
        return None
    from plait.ir.ops.aten import bind_call

    a = node.attrs
    masked = node.op == "batch_norm_relu_backward"
    operands = len(node.inputs) - masked  # NOTE: the ReLU's result y is the last operand
    bound = bound_slots(*key, a["literals"], a["kwliterals"], operands)
    fallback = bind_call(a["name"], a["overload"], a["literals"], a["kwliterals"], operands)
    if fused:
        fallback = _relu_after(fallback) if not masked else _mask_before(fallback, bound)
    what = ("backward" if key == BACKWARD else "forward") + (FUSED[node.op] if fused else "")
    ix = _slot(bound, "input")
    x = node.inputs[ix] if ix is not None else None
    t = x.type if isinstance(x, Value) else None
    if not (isinstance(t, TensorType) and t.dtype in DTYPES and t.rank >= 2):
        # NOTE: ATen's call (with the ReLU where fused), as the plan's detail then says
        return ExternCall(fallback, "normalization", ATEN.format(*key, what)) if fused else None
    if key == BACKWARD:
        fn = _backward_fn(bound, fallback, operands if masked else None)
        return ExternCall(fn, "normalization", DETAIL.format(what))
    return ExternCall(_forward_fn(bound, fallback, fused), "normalization", DETAIL.format(what))


def _relu_after(aten_fn: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """ATen's batch norm, then ``relu`` on its normalized result (``batch_norm_relu``)."""

    def fn(tensors: list[Any]) -> Any:
        out = aten_fn(tensors)
        return (torch.relu(out[0]), *out[1:])

    return fn


def _mask_before(aten_fn: Callable[[list[Any]], Any], bound: dict[str, Any]) -> Any:
    """``where(le(y, 0), 0.0, grad_out)`` (``y`` the last operand), then ATen's backward
    (``batch_norm_relu_backward``)."""
    ig = _slot(bound, "grad_out")
    assert ig is not None  # NOTE: the op's type rule checked it

    def fn(tensors: list[Any]) -> Any:
        *operands, y = tensors
        operands[ig] = torch.where(torch.le(y, 0), 0.0, operands[ig])
        return aten_fn(operands)

    return fn


def _slot(bound: dict[str, Any], name: str) -> int | None:
    v = bound.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _takes(x: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Whether the kernels take ``x`` (and the per-channel tensors ``others``)."""
    if not (x.is_cuda or _interpreting()) or x.dtype not in DTYPES or x.dim() < 2:
        return False
    if x.numel() == 0 or not x.is_contiguous() or x.numel() >= 1 << 30:
        return False
    if x.numel() // x.shape[1] <= 1:
        return False
    for t in others:
        if t is not None and (t.dtype not in DTYPES or not t.is_contiguous() or t.dim() != 1):
            return False
    return True


def _interpreting() -> bool:
    from plait.codegen.triton_load import interpreting

    return interpreting()


def _forward_fn(bound: dict[str, Any], fallback: Callable[[list[Any]], Any], relu: bool) -> Any:
    ix, iw, ib = _slot(bound, "input"), _slot(bound, "weight"), _slot(bound, "bias")
    irm, irv = _slot(bound, "running_mean"), _slot(bound, "running_var")
    momentum, eps = float(bound["momentum"]), float(bound["eps"])
    assert ix is not None and bool(bound["training"])

    def fn(tensors: list[Any]) -> Any:
        x = tensors[ix]
        w, b, rm, rv = (None if i is None else tensors[i] for i in (iw, ib, irm, irv))
        if not _takes(x, w, b, rm, rv):
            return fallback(tensors)
        return forward(x, w, b, rm, rv, momentum, eps, relu=relu)

    return fn


def _backward_fn(
    bound: dict[str, Any], fallback: Callable[[list[Any]], Any], iy: int | None
) -> Any:
    """``iy``: the operand of the ReLU's result whose mask the gradient takes (fused), or None."""
    ig, ix, iw = _slot(bound, "grad_out"), _slot(bound, "input"), _slot(bound, "weight")
    imean, irstd = _slot(bound, "save_mean"), _slot(bound, "save_invstd")
    mask = [bool(m) for m in bound["output_mask"]]
    train = bool(bound["train"])

    def fn(tensors: list[Any]) -> Any:
        if not train or ig is None or ix is None or imean is None or irstd is None:
            return fallback(tensors)
        g, x, mean, rstd = tensors[ig], tensors[ix], tensors[imean], tensors[irstd]
        w = None if iw is None else tensors[iw]
        y = None if iy is None else tensors[iy]
        per_channel = (mean, rstd) if w is None else (mean, rstd, w)
        if w is None and (mask[1] or mask[2]):
            return fallback(tensors)
        if not _takes(x, *per_channel) or g.shape != x.shape or not g.is_contiguous():
            return fallback(tensors)
        if y is not None and (y.shape != x.shape or not y.is_contiguous()):
            return fallback(tensors)
        if mean.dtype != torch.float32 or rstd.dtype != torch.float32:
            return fallback(tensors)
        dx, dw, db = backward(g, x, w, mean, rstd, mask, relu_out=y)
        kept = [t for t in (dx, dw, db) if t is not None]
        return kept[0] if len(kept) == 1 else tuple(kept)

    return fn


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def tiles(rows: int, length: int, tile: int = 2048, row: int = 1024) -> tuple[int, int, int]:
    """``(RB, LB, warps)``: a tile of up to ``tile`` values, rows of ``length`` values taken
    ``row`` at most at a time.

    >>> tiles(4, 12544), tiles(64, 49)
    ((2, 1024, 8), (32, 64, 8))
    """
    lb = min(_pow2(length), row)
    rb = max(1, min(_pow2(rows), tile // lb))
    return rb, lb, 8 if rb * lb >= 2048 else 4


def splits(n: int, c: int, length: int) -> tuple[int, int]:
    """``(S, rows)``: each channel's ``n`` rows (of ``length`` values) in ``S`` splits of
    ``rows`` rows (a power of two, up to ``n``), so that ``c * S`` programs fill the GPU and
    each split sums at least :data:`MIN_SPLIT` values where it can.

    >>> splits(64, 64, 12544), splits(64, 2048, 49), splits(64, 256, 196)
    ((32, 2), (1, 64), (4, 16))
    """
    want = max(1, min(math.ceil(PROGRAMS / c), (n * length) // MIN_SPLIT, n))
    rows = min(n, _pow2(math.ceil(n / want)))  # NOTE: whole tiles of rows
    return math.ceil(n / rows), rows


def _last_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def last_reads(n: int, c: int, length: int) -> tuple[int, int]:
    """``(row, col)``: of an ``(n, c, length)`` input, the values at a row ``>= row`` and a
    column ``>= col`` are the last that the threads of eager's CUDA statistics kernel read.

    ATen (``Normalization.cuh``) takes each thread's mean and variance by Welford's update
    ``mean += (v - mean) / k``: after an infinity the thread's next value, or the channels-last
    kernel's next masked step (``(0 - mean) * 0``), makes its mean NaN (``inf - inf``), and so
    the channel's; an infinity read last stays (``+-inf``, NaN for both signs). The NCHW kernel
    (``length > 1``) runs blocks of ``tf x 512 / tf`` threads (``tf`` the least of 32, ..., 512
    that covers ``length``), thread ``(i, j)`` reading rows ``j, j + 512 / tf, ...`` of columns
    ``i, i + tf, ...``; a contiguous ``(n, c)`` input (``length == 1``, stride 1 between
    channels) runs the channels-last kernel, whose threads read ``by * gy`` rows apart, four
    loads a step (``by``, ``gy``: ATen's ``flexible_launch_configs``), for the same number of
    steps each.

    >>> last_reads(5, 3, 99), last_reads(64, 256, 3136), last_reads(9, 6, 1)
    ((1, -29), (63, 2624), (8, 0))
    """
    if length > 1:
        tf = next((t for t in (32, 64, 128, 256) if length <= t), 512)
        return n - max(1, 512 // tf), length - tf
    bx = min(_last_pow2(c), 32)
    by = min(_last_pow2(math.ceil(n / 16)), 512 // bx)
    gy = min(math.ceil(n / (by * 16)), 128)
    step = by * (gy if gy >= 8 else 1) * 4  # NOTE: one block row of the grid under 8
    return (n - 1) // step * step, 0


def _kernels() -> Any:
    from plait.codegen import cuda_batch_norm_kernels
    from plait.codegen.triton_load import torch_ptxas_once

    torch_ptxas_once()
    return cuda_batch_norm_kernels


def _launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
    if _interpreting():
        import numpy as np

        with np.errstate(all="ignore"):
            kernel[grid](*args, **{k: v for k, v in meta.items() if k != "num_warps"})
        return
    kernel[grid](*args, **meta)


def _split_over_batch(x: torch.Tensor) -> tuple[Any, int, int, int, int, int, torch.Tensor]:
    """The kernels, ``x``'s batch, channels and values per row, its :func:`splits` (count and
    rows each) and the float32 buffer of the splits' two partial results per channel."""
    n, c = x.shape[0], x.shape[1]
    length = x.numel() // (n * c)
    s, rows = splits(n, c, length)
    part = torch.empty((s, c, 2), device=x.device, dtype=torch.float32)
    return _kernels(), n, c, length, s, rows, part


def forward(
    x: torch.Tensor,
    w: torch.Tensor | None,
    b: torch.Tensor | None,
    rm: torch.Tensor | None,
    rv: torch.Tensor | None,
    momentum: float,
    eps: float,
    relu: bool = False,
) -> tuple[torch.Tensor, ...]:
    """``_native_batch_norm_legit_functional``'s results (``no_stats``'s without running
    statistics): ``(y, mean, rstd[, new_running_mean, new_running_var])``; ``relu``: ``y``
    passed through ``relu`` (``batch_norm_relu``'s results)."""
    k, n, c, length, s, rows, part = _split_over_batch(x)
    f32 = torch.float32
    mean = torch.empty((c,), device=x.device, dtype=f32)
    rstd = torch.empty((c,), device=x.device, dtype=f32)
    y = torch.empty_like(x)
    rb, lb, warps = tiles(rows, length, REDUCE_TILE, REDUCE_ROW)
    row_last, col_last = last_reads(n, c, length)
    _launch(
        k._moments, (c, s), x, part, c, n, row_last, col_last,
        L=length, ROWS=rows, RB=rb, LB=lb, num_warps=warps,
    )  # fmt: skip
    running = rm is not None and rv is not None
    new_rm = torch.empty_like(rm) if rm is not None else mean
    new_rv = torch.empty_like(rv) if rv is not None else rstd
    cb = 128
    _launch(
        k._finalize_moments, (math.ceil(c / cb),), part, mean, rstd,
        rm if running else mean, rv if running else rstd, new_rm, new_rv,
        c, length, n, eps, momentum, ROWS=rows, S=s, RUNNING=running, CB=cb, num_warps=4,
    )  # fmt: skip
    rb, lb, warps = tiles(n * c, length, ELEMENT_TILE, ELEMENT_ROW)
    grid = (math.ceil(n * c / rb), math.ceil(length / lb))
    _launch(
        k._normalize, grid, x, y, mean, rstd, w if w is not None else mean,
        b if b is not None else mean, c, length, n * c,
        HAS_W=w is not None, HAS_B=b is not None, RELU=relu, RB=rb, LB=lb, num_warps=warps,
    )  # fmt: skip
    if running:
        return y, mean, rstd, new_rm, new_rv
    return y, mean, rstd


def backward(
    g: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    mask: Sequence[bool],
    relu_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``native_batch_norm_backward``'s results in training mode: ``(dx, dw, db)``, each None
    where ``mask`` does not ask for it; with ``relu_out`` (a ReLU's result, contiguous, of
    ``g``'s shape) those of ``where(le(relu_out, 0), 0.0, g)`` (``batch_norm_relu_backward``'s),
    the mask applied as the kernels read ``g``."""
    y = relu_out if relu_out is not None else g  # NOTE: a pointer the kernels never read then
    masked = relu_out is not None
    k, n, c, length, s, rows, part = _split_over_batch(x)
    coef = torch.empty((c, 3), device=x.device, dtype=torch.float32)
    rb, lb, warps = tiles(rows, length, REDUCE_TILE, REDUCE_ROW)
    _launch(
        k._grad_sums, (c, s), g, y, x, mean, part, c, n,
        L=length, ROWS=rows, MASKED=masked, RB=rb, LB=lb, num_warps=warps,
    )  # fmt: skip
    dw = torch.empty_like(w) if w is not None else None
    db = torch.empty_like(w) if w is not None else None
    cb = 128
    _launch(
        k._finalize_grads, (math.ceil(c / cb),), part, rstd, w if w is not None else rstd,
        dw if dw is not None else coef, db if db is not None else coef, coef, c, length, n,
        S=s, HAS_W=w is not None, CB=cb, num_warps=4,
    )  # fmt: skip
    dx = None
    if mask[0]:
        dx = torch.empty_like(x)
        rb, lb, warps = tiles(n * c, length, ELEMENT_TILE, ELEMENT_ROW)
        grid = (math.ceil(n * c / rb), math.ceil(length / lb))
        _launch(
            k._grad_input, grid, g, y, x, mean, coef, dx, c, length, n * c,
            MASKED=masked, RB=rb, LB=lb, num_warps=warps,
        )  # fmt: skip
    return dx, dw if mask[1] else None, db if mask[2] else None

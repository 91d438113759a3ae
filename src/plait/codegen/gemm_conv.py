"""A convolution's backward (``aten.convolution_backward``, a training program's) as GEMMs:
an im2col of the saved input, a product for the weight's gradient (``G^T @ cols``) and for the
columns' gradient (``G @ W``, the weight viewed as ``[O, C*kh*kw]``: no reorder), then a col2im
(``csrc/im2col.h``, native kernels through the kernel cache) for the input's gradient.

The products run plait's native 1x1 convolution kernel (:mod:`.pointwise_native`: rows by
output columns in registers, each sum in order with fused multiply-adds) where the CPU has
AVX-512 and the columns' width is a multiple of 16, else MKL's ``mm``. On ResNet-18's layer4
shapes at two threads of an AMD EPYC (Zen 4) the native kernel took 3.9 and 3.3 ms where MKL
took 5.6 and 3.9 (``[128, 512] @ [512, 4608]`` and ``[512, 128] @ [128, 4608]``): MKL splits
these short products poorly between threads.

oneDNN's backward reorders the weight and the activations between plain and blocked layouts at
every call; on small maps with many channels the GEMMs cost less (ResNet-18, batch 8 at
112x112, two threads of an AVX-512 Xeon: layer4's 3x3 convolutions' backward 2.2-4.6 ms
against oneDNN's 5.8-6.8 ms; on layer1's 28x28 maps oneDNN's took half the time). So the
choice is made per call by timing both at compile time on the call's shapes
(:data:`plait.codegen.timed_matmul.STAGE`, remembered per machine by
:mod:`plait.codegen.timed_choices`); the node's evidence says which ran and why.

Taken: float32 CPU operands of static shapes, one group, not transposed, strict float32 math
(:func:`plait.codegen.timed_matmul.strict_float32`), and columns of at most :data:`MAX_COLS`
bytes. The sums run in another order than oneDNN's (the contract's conv budget). A padded tap
reads 0 in the columns: where the output's gradient has an infinity or NaN, its product with a
padded 0 would be NaN in the weight's gradient where eager's kernel skips the tap, so such a call
(padding only) runs eager's kernel, checked at each call. An input's gradient that is not all
finite (an infinite or NaN weight, or output gradient) is made again by eager's kernel too: where
one tap of the weight is infinite, oneDNN's gradient holds NaNs at inputs that tap never reads
(its products with zeros it adds), which the GEMMs leave finite; one pass over the input's
gradient checks it.

Example:
    >>> import torch
    >>> g, x, w = torch.randn(2, 4, 5, 5), torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    >>> geo = Geometry((2, 3, 5, 5), (4, 3, 3, 3), (5, 5), (1, 1), (1, 1), (1, 1))
    >>> dx, dw = backward_fn(geo, (True, True, False))([g, x, w])
    >>> want = torch.ops.aten.convolution_backward(g, x, w, None, [1, 1], [1, 1], [1, 1],
    ...                                            False, [0, 0], 1, [True, True, False])
    >>> torch.allclose(dx, want[0], atol=1e-4), torch.allclose(dw, want[1], atol=1e-4)
    (True, True)
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from plait.codegen import pointwise_native, timed_matmul
from plait.codegen.errors import BuildError
from plait.codegen.extern import Consts, make_call
from plait.codegen.extern_call import ExternCall
from plait.codegen.native_entries import build_entries, shipped
from plait.codegen.plan import ExternStep
from plait.codegen.timed_matmul import strict_float32
from plait.ir.graph import Node, Value
from plait.ir.ops.call_literals import decode_call
from plait.ir.types import TensorType

# NOTE: the columns of one call (N*OH*OW rows of C*kh*kw floats) at most this many bytes: a
# large map's columns cost more memory traffic than the GEMMs save (and memory itself)
MAX_COLS = 64 << 20
LIBRARY = "MKL"
NATIVE_LIBRARY = "plait's native GEMM"
DETAIL = "im2col + GEMMs + col2im (native), convolution backward"


@dataclass(frozen=True)
class Geometry:
    """A convolution's sizes: input ``x`` (N, C, H, W), weight ``w`` (O, C, kh, kw), output map
    ``out`` (OH, OW), and its stride, padding and dilation."""

    x: tuple[int, int, int, int]
    w: tuple[int, int, int, int]
    out: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]

    @property
    def rows(self) -> int:
        return self.x[0] * self.out[0] * self.out[1]

    @property
    def cols(self) -> int:
        return self.w[1] * self.w[2] * self.w[3]

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution without padding or dilation: its columns are a strided slice."""
        return self.w[2:] == (1, 1) and self.padding == (0, 0)

    def params(self) -> list[int]:
        n, c, h, w = self.x
        return [n, c, h, w, *self.out, *self.w[2:], *self.stride, *self.padding, *self.dilation]


def _static_f32(v: object) -> tuple[int, ...] | None:
    if not isinstance(v, Value) or not isinstance(v.type, TensorType):
        return None
    t = v.type
    if t.dtype != torch.float32 or t.device != "cpu" or not t.is_static or t.rank != 4:
        return None
    shape = tuple(int(d) for d in t.shape)
    return shape if all(shape) else None


def eligible(node: Node) -> tuple[Geometry, tuple[bool, bool, bool]] | None:
    """``node``'s geometry and output mask where it is a convolution backward this module runs
    (see the module doc), else None."""
    a = node.attrs
    if node.op != "aten" or a.get("name") != "convolution_backward" or len(node.inputs) != 3:
        return None
    if a.get("overload") != "default" or a.get("kwliterals"):
        return None
    shapes = [_static_f32(v) for v in node.inputs]
    if any(s is None for s in shapes) or not strict_float32():
        return None
    try:
        args, _ = decode_call([0, 1, 2], a["literals"], "")
    except (ValueError, TypeError, KeyError):
        return None
    if len(args) != 11 or args[:3] != [0, 1, 2]:
        return None
    _, stride, padding, dilation, transposed, out_pad, groups, mask = args[3:]
    if transposed or groups != 1 or any(out_pad):
        return None
    if not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in (stride, padding, dilation)):
        return None
    gs, xs, ws = shapes
    assert gs is not None and xs is not None and ws is not None
    if ws[1] != xs[1] or gs[:2] != (xs[0], ws[0]):
        return None
    geo = Geometry(xs, ws, gs[2:], tuple(stride), tuple(padding), tuple(dilation))  # type: ignore[arg-type]
    if geo.rows * geo.cols * 4 > MAX_COLS or min(geo.stride) < 1 or min(geo.padding) < 0:
        return None
    return geo, (bool(mask[0]), bool(mask[1]), bool(mask[2]))


# --- the kernels ------------------------------------------------------------------------------
def source() -> str:
    """The kernels' C++ as shipped (``csrc/im2col.h``)."""
    return shipped("im2col.h")


ENTRIES = {"plait_im2col_nchw": "i2c::im2col(p, f)", "plait_col2im_nchw": "i2c::col2im(p, f)"}


def kernels() -> tuple[Any, Any]:
    """The im2col and col2im entries, built once per machine through the kernel cache (raises
    :class:`~plait.codegen.errors.BuildError` where they cannot be built)."""
    found = build_entries(source(), ENTRIES)
    return found["plait_im2col_nchw"], found["plait_col2im_nchw"]


def _run(fn: Any, src: torch.Tensor, dst: torch.Tensor, geo: Geometry) -> None:
    table = torch.empty(geo.out[0] * geo.out[1] * geo.w[2] * geo.w[3], dtype=torch.int64)
    params = (ctypes.c_int64 * 17)(src.data_ptr(), dst.data_ptr(), *geo.params(), table.data_ptr())
    fn(params, None)  # NOTE: src, dst and table stay referenced until it returns


def columns(x: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """The ``[N*OH*OW, C*kh*kw]`` columns of the contiguous NCHW map ``x``."""
    if geo.pointwise:
        sh, sw = geo.stride
        picked = x[:, :, ::sh, ::sw][:, :, : geo.out[0], : geo.out[1]]
        return picked.permute(0, 2, 3, 1).reshape(geo.rows, geo.cols)
    cols = torch.empty(geo.rows, geo.cols, dtype=torch.float32)
    _run(kernels()[0], x, cols, geo)
    return cols


def image(dcols: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """The NCHW map whose columns' gradient is ``dcols`` (each element the sum of its taps)."""
    n, c = geo.x[:2]
    if geo.pointwise:
        dx = torch.zeros(geo.x, dtype=torch.float32)
        sh, sw = geo.stride
        oh, ow = geo.out
        dx[:, :, : (oh - 1) * sh + 1 : sh, : (ow - 1) * sw + 1 : sw] = dcols.view(
            n, oh, ow, c
        ).permute(0, 3, 1, 2)
        return dx
    dx = torch.empty(geo.x, dtype=torch.float32)
    _run(kernels()[1], dcols, dx, geo)
    return dx


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite, by its sum: an infinity or NaN makes the sum
    non-finite; finite values whose sum overflows only send the call to eager's kernel (25x
    cheaper than ``isfinite(t).all()``: no mask is made).

    >>> _all_finite(torch.ones(3)), _all_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    """
    return math.isfinite(float(t.sum()))


def native_products(geo: Geometry) -> bool:
    """Whether ``geo``'s products run plait's native kernel (see the module doc), not MKL."""
    return pointwise_native.available() and geo.cols % 16 == 0


def _native_mm() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``a @ b`` for ``a [P, C]`` and ``b [C, O]``, ``O`` a multiple of 16, through the native
    1x1 kernel (no bias, residual or activation), which reads both row-major: each is made
    contiguous (``G^T`` is copied). Raises :class:`~plait.codegen.errors.BuildError` where the
    kernel cannot be built."""
    fn = pointwise_native.kernel(pointwise_native.NONE, False)
    bounds = (ctypes.c_float * 2)(-math.inf, math.inf)

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        (p, c), o = a.shape, int(b.shape[1])
        y = torch.empty(p, o, dtype=torch.float32)
        # NOTE: the last parameter 0: b is row-major [C][O], not the blocked packed weight
        ptrs = (a.data_ptr(), b.data_ptr(), 0, 0, y.data_ptr())
        params = (ctypes.c_int64 * 10)(*ptrs, p, c, o, o, 0)
        fn(params, bounds)  # NOTE: a, b and y stay referenced until it returns
        return y

    return product


def backward_fn(
    geo: Geometry, mask: tuple[bool, bool, bool], eager: Callable[[list[Any]], Any] | None = None
) -> Callable[[list[Any]], Any]:
    """The call over the node's operands ``[g, x, w]``: the gradients ``mask`` asks for (input,
    weight, bias), a single one as the tensor itself. ``eager``: PyTorch's kernel, run where the
    output's gradient is not all finite and the convolution pads, or where the input's gradient
    is not all finite (see the module doc). Raises
    :class:`~plait.codegen.errors.BuildError` where a native kernel cannot be built."""
    o = geo.w[0]
    padded = any(geo.padding)
    mm = _native_mm() if native_products(geo) else torch.mm
    if not geo.pointwise:
        kernels()  # NOTE: built now: a build failure refuses the call at compile time

    def run(tensors: list[Any]) -> Any:
        g, x, w = tensors
        if padded and eager is not None and not _all_finite(g):
            return eager(tensors)
        grad = g.permute(0, 2, 3, 1).reshape(geo.rows, o)
        out: list[torch.Tensor] = []
        if mask[0]:
            dcols = mm(grad, w.reshape(o, geo.cols))
            dx = image(dcols, geo)
            if eager is not None and not _all_finite(dx):
                return eager(tensors)  # NOTE: a non-finite weight or gradient: eager's NaNs
            out.append(dx)
        if mask[1]:
            cols = columns(x.contiguous(), geo)
            out.append(mm(grad.t(), cols).view(geo.w))
        if mask[2]:
            out.append(grad.sum(0))
        return out[0] if len(out) == 1 else tuple(out)

    return run


def gemm_call(node: Node, eager: ExternCall) -> ExternCall | None:
    """``node`` as :func:`backward_fn`'s call (``eager``: the node's PyTorch call, its fallback
    for non-finite gradients), or None where :func:`eligible` refuses it."""
    found = eligible(node)
    if found is None:
        return None
    geo, mask = found
    native = native_products(geo)
    library = NATIVE_LIBRARY if native else LIBRARY
    detail = f"{DETAIL} ({library} products)"
    entries = (pointwise_native.symbol(pointwise_native.NONE, False),) if native else ()
    fn = backward_fn(geo, mask, eager.fn)
    return ExternCall(fn, eager.op_class, detail, library, entries=entries)


def timed_step(node: Node, consts: Consts, matmul: bool, gemm: bool) -> ExternStep | None:
    """The step timed against PyTorch's kernel for ``node`` at compile time: oneDNN's matmul for
    a float32 product (``matmul``: :mod:`plait.codegen.timed_matmul`), this module's call for a
    convolution backward (``gemm``), else None (also where the kernels cannot be built: the
    node then runs PyTorch's kernel, as without ``gemm``)."""
    if matmul and timed_matmul.eligible(node):
        return ExternStep(node, timed_matmul.onednn_call(node), [])
    if not gemm:
        return None
    try:
        call = gemm_call(node, make_call(node, consts))
    except BuildError:
        return None
    return None if call is None else ExternStep(node, call, [])


def chosen(timed: ExternStep, failure: str | None, accepted: str) -> tuple[ExternStep | None, str]:
    """The step that runs (``timed``, or None: PyTorch's kernel, where timing refused it with
    ``failure``) and the node's evidence note, which says, for this module's call, how timing
    chose (``accepted``: the note so far)."""
    step = timed if failure is None else None
    if not timed.call.detail.startswith(DETAIL):
        return step, accepted
    why = (
        "timed faster than PyTorch's kernel at compile time"
        if failure is None
        else f"im2col GEMM backward not taken: {failure}"
    )
    return step, "; ".join(x for x in (accepted, why) if x)

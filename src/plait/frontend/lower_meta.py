"""Metadata reads (answered from the tracer, guarded) and reads of tensor data (refused).

NOTE: dtype, device and rank are fixed by the input types, which are always guarded; sizes are
returned as TracedInts so the comparisons the program makes become named guards.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from plait.errors import ProgramIndexError, ProgramTypeError
from plait.frontend import datadep  # noqa: F401  (rules: nonzero, unique, masked_select, ...)
from plait.frontend.symints import TracedSize
from plait.frontend.table import data_read, getter, meta
from plait.frontend.tracer import CaptureContext

T = torch.Tensor


_getter = getter


def _plain(cx: CaptureContext, x: Any) -> torch.Tensor:
    return cx.tracer(x)._plain


@meta(_getter("shape"))
def _shape(cx: CaptureContext, x: Any) -> Any:
    return cx.sizes(cx.tracer(x))


@meta(T.size)
def _size(cx: CaptureContext, x: Any, dim: Any = None) -> Any:
    sizes = cx.sizes(cx.tracer(x))
    if dim is None:
        return sizes
    rank, d = len(sizes), int(dim)
    if not -rank <= d < rank:
        raise ProgramIndexError(
            f"Dimension out of range (expected to be in range of [{-rank}, "
            f"{rank - 1}], but got {d})"
        )
    return sizes[d]


@meta(T.dim, T.ndimension, _getter("ndim"))
def _rank(cx: CaptureContext, x: Any) -> int:
    return _plain(cx, x).dim()


@meta(T.numel, T.nelement)
def _numel(cx: CaptureContext, x: Any) -> Any:
    sizes = cx.sizes(cx.tracer(x))
    return sizes.numel() if isinstance(sizes, TracedSize) else math.prod(sizes)


@meta(T.__len__)
def _len(cx: CaptureContext, x: Any) -> Any:
    sizes = cx.sizes(cx.tracer(x))
    if not len(sizes):
        raise ProgramTypeError("len() of a 0-d tensor")
    # NOTE: len() hands Python a plain int (CPython copies an int subclass's value without
    # calling __index__), so a symbolic size is specialized here, not left to a hook
    return cx.int(sizes[0])


@meta(_getter("dtype"))
def _dtype(cx: CaptureContext, x: Any) -> torch.dtype:
    return _plain(cx, x).dtype


@meta(_getter("device"))
def _device(cx: CaptureContext, x: Any) -> torch.device:
    return _plain(cx, x).device


@meta(_getter("requires_grad"))
def _requires_grad(cx: CaptureContext, x: Any) -> bool:
    return cx.tracer(x)._rg


# NOTE: facts fixed by dtype, device and layout, which the input types pin down.
_STATIC = [
    (T.is_floating_point, lambda t: t.is_floating_point()),
    (torch.is_floating_point, lambda t: t.is_floating_point()),
    (T.is_complex, lambda t: t.is_complex()),
    (torch.is_complex, lambda t: t.is_complex()),
    (T.is_signed, lambda t: t.is_signed()),
    (torch.is_signed, lambda t: t.is_signed()),
    (_getter("is_cuda"), lambda t: t.is_cuda),
    (_getter("is_cpu"), lambda t: t.is_cpu),
    (_getter("is_meta"), lambda t: t.is_meta),
    (_getter("is_sparse"), lambda t: t.is_sparse),
    (_getter("is_quantized"), lambda t: t.is_quantized),
    (_getter("is_mkldnn"), lambda t: t.is_mkldnn),
    (_getter("is_nested"), lambda t: t.is_nested),
    (_getter("layout"), lambda t: t.layout),
    (T.element_size, lambda t: t.element_size()),
    (_getter("itemsize"), lambda t: t.itemsize),
    (T.get_device, lambda t: t.get_device()),
]


def _static_meta(func: Any, read: Any) -> None:
    @meta(func)
    def rule(cx: CaptureContext, x: Any, *args: Any, **kwargs: Any) -> Any:
        return read(_plain(cx, x))


for _func, _read in _STATIC:
    _static_meta(_func, _read)


@meta(T.is_contiguous)
def _is_contiguous(cx: CaptureContext, x: Any, memory_format: Any = None) -> bool:
    # NOTE: the answer for the capture sample; layouts are not part of the IR (documented), so
    # the guards pin the strides of the inputs it may depend on.
    t = _plain(cx, x)
    if cx.layout_read is None:
        cx.layout_read = cx.current
    return (
        t.is_contiguous() if memory_format is None else t.is_contiguous(memory_format=memory_format)
    )


@meta(
    T.requires_grad_,
    _getter("requires_grad", "__set__"),
    T.stride,
    T.storage_offset,
    T.data_ptr,
    T.untyped_storage,
    T.retain_grad,
    T.register_hook,
    T.detach_,
    _getter("data", "__set__"),
)
def _layout_or_autograd(cx: CaptureContext, x: Any, *args: Any, **kwargs: Any) -> Any:
    cx.limitation(
        "strides, storage and autograd state of a tensor are not part of a captured program"
    )


data_read("converting a tensor to a Python bool (e.g. `if tensor:`)", T.__bool__)
data_read("Tensor.item()", T.item)
data_read("Tensor.tolist()", T.tolist)
data_read("int(tensor)", T.__int__)
data_read("float(tensor)", T.__float__)
data_read("complex(tensor)", T.__complex__)
data_read("using a tensor as a Python index", T.__index__)
data_read("printing or formatting a tensor", T.__repr__, T.__format__)
data_read("converting a tensor to NumPy", T.numpy, T.__array__)
data_read("`in` on a tensor", T.__contains__)
data_read("torch.equal (a Python bool from tensor values)", torch.equal, T.equal)
data_read("allclose (a Python bool from tensor values)", torch.allclose, T.allclose)


@meta(torch.device)
def _device_object(cx: CaptureContext, *args: Any, **kwargs: Any) -> torch.device:
    # NOTE: constructing a device object (torch.random.fork_rng does) reads no tensor
    return torch.device(*args, **kwargs)


@meta(torch._assert)
def _assert(cx: CaptureContext, condition: Any, message: Any = "") -> None:
    # NOTE: a Python bool here is already guarded (a size comparison records its guard when
    # it is made): the assert is that guard and nothing else. A tensor is a read of its data.
    if isinstance(condition, torch.Tensor):
        cx.fail(
            "data-dependent",
            "torch._assert on a tensor reads its data; a graph cannot check the values it computes",
        )
    assert condition, message


@meta(torch._C._set_grad_enabled)
def _set_grad_enabled(cx: CaptureContext, mode: Any) -> None:
    # NOTE: `torch.no_grad()`, `enable_grad()`, `set_grad_enabled(m)` and `@torch.no_grad()`
    # inside the program. Turning grad mode off in a call that runs with it on is captured (the
    # tracer detaches what is computed inside); turning it on in a call that runs without it
    # would need gradients the compiled call does not make: refused.
    if bool(mode) and not cx.ambient_grad:
        cx.limitation(
            "enabling grad mode inside a program called under torch.no_grad() is not "
            "captured; call the compiled program with grad mode on, or move the switch "
            "outside it"
        )
    cx.grad_enabled = bool(mode)
    torch._C._set_grad_enabled(bool(mode))

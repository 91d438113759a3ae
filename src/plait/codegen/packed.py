"""oneDNN's prepacked weights as bytes, and back: what lets a cache entry carry them.

A prepacked weight (``torch.ops.mkldnn._reorder_convolution_weight`` and friends) is an opaque
``torch._mkldnn`` tensor in oneDNN's blocked layout. Reordering one again on every warm start
costs about as much as a steady-state call of the model (ResNet-18: 20 reorders, 45 MB, 30-45 ms
on 2 cores, most of it oneDNN choosing the layout), so a compile saves the bytes instead, the way
PyTorch's AOTInductor saves frozen oneDNN weights: the bytes (``mkldnn.data_ptr``,
``mkldnn._nbytes``) and oneDNN's serialized memory descriptor
(``mkldnn._get_mkldnn_serialized_md``), read back through AOTInductor's C shim
(``aoti_torch_create_tensor_from_blob_v2`` with the mkldnn layout, in ``libtorch_cpu``), whose
handle ``torch._C._aoti`` turns into a tensor.

Invariants: an imported tensor *borrows* its bytes (the caller keeps ``data`` alive as long as the
tensor); the descriptor is only ever one this PyTorch build wrote (cache entries are keyed by the
build), and it must describe the shape, dtype and byte count the caller names; a layout that does
not suit the kernel that reads it is reordered by oneDNN at the call, so a saved weight can cost
time but never change a result.

Example:
    >>> import torch
    >>> w = torch.randn(8, 4, 3, 3)
    >>> p = torch.ops.mkldnn._reorder_convolution_weight(w, [1, 1], [1, 1], [1, 1], 1, [1, 4, 5, 5])
    >>> data, md = export_packed(p)
    >>> q = import_packed(data, md, p.shape, p.dtype)
    >>> torch.equal(q.to_dense(), p.to_dense())
    True
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from plait.codegen import build
from plait.errors import InvalidOptionError, StoreFormatError


class PackedUnavailable(RuntimeError):
    """This PyTorch cannot export or import prepacked weights (the reason says what is missing)."""


@functools.cache
def _shim() -> Any:
    """The C shim's functions, resolved once; raises :class:`PackedUnavailable`."""
    lib_dir = Path(torch.__file__).parent / "lib"
    try:
        lib = ctypes.CDLL(str(lib_dir / "libtorch_cpu.so"))
        create = lib.aoti_torch_create_tensor_from_blob_v2
        codes = {
            "layout": lib.aoti_torch_layout__mkldnn,
            "cpu": lib.aoti_torch_device_type_cpu,
            torch.float32: lib.aoti_torch_dtype_float32,
            torch.bfloat16: lib.aoti_torch_dtype_bfloat16,
        }
        steal = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr
        for op in ("data_ptr", "_nbytes", "_get_mkldnn_serialized_md"):
            getattr(torch.ops.mkldnn, op)
    except (OSError, AttributeError, RuntimeError) as exc:
        raise PackedUnavailable(f"this PyTorch lacks oneDNN weight serialization: {exc}") from None
    i64p = ctypes.POINTER(ctypes.c_int64)
    create.restype = ctypes.c_int32
    create.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, i64p, i64p, ctypes.c_int64, ctypes.c_int32,
        ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32,
        ctypes.c_void_p, ctypes.c_int64,
    ]  # fmt: skip
    values = {}
    for name, fn in codes.items():
        fn.restype = ctypes.c_int32
        values[name] = fn()
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype = ctypes.py_object
    capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return create, values, steal, capsule


_PROBED = (torch.float32, torch.bfloat16)


@functools.cache
def _dtype_field() -> tuple[int, dict[torch.dtype, bytes]]:
    """Where a serialized descriptor holds its data type, and each dtype's bytes there (see
    :func:`_probe_dtype_field`), remembered on disk for the installed PyTorch (the probe
    starts oneDNN, a few ms a warm start need not pay)."""
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    identity = [build.file_identity(lib), torch.__version__]

    def probe() -> dict[str, object]:
        start, codes = _probe_dtype_field()
        return {"start": start, "codes": {str(dt): list(c) for dt, c in codes.items()}}

    found = build.remembered("onednn_md_dtype", identity, probe)
    try:
        start = int(found["start"])  # type: ignore[call-overload]
        table = found["codes"]
        assert isinstance(table, dict)
        return start, {dt: bytes(table[str(dt)]) for dt in _PROBED}
    except (KeyError, TypeError, ValueError, AssertionError):
        return _probe_dtype_field()


def _probe_dtype_field() -> tuple[int, dict[torch.dtype, bytes]]:
    """Found by serializing one plain one-element tensor of each dtype. Their descriptors first
    differ in the data type (an int32 enum, after the dims); the struct padding after it is not
    initialized, so later bytes may differ too and are not read. Raises
    :class:`PackedUnavailable` when the field found is not a small enum."""
    mds = {
        dt: bytes(torch.ops.mkldnn._get_mkldnn_serialized_md(torch.zeros(1, dtype=dt).to_mkldnn()))
        for dt in _PROBED
    }
    a, b = mds[torch.float32], mds[torch.bfloat16]
    diff = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)
    if len(a) != len(b) or diff is None:
        raise PackedUnavailable("oneDNN's descriptors do not name their data type")
    start = diff - diff % 4
    codes = {dt: md[start : start + 4] for dt, md in mds.items()}
    if any(code[1:] != bytes(3) for code in codes.values()):  # NOTE: a little-endian small enum
        raise PackedUnavailable("oneDNN's descriptor format is not the one plait reads")
    return start, codes


def unavailable() -> str | None:
    """Why prepacked weights cannot be saved here, or None when they can."""
    try:
        _shim()
    except PackedUnavailable as exc:
        return str(exc)
    return None


def export_packed(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, md)`` of a prepacked (``torch._mkldnn``) tensor: its bytes and oneDNN's
    serialized memory descriptor, as uint8 tensors. ``data`` is a view of ``t``'s memory, not a
    copy: the caller keeps ``t`` alive (and unchanged) as long as ``data``."""
    _shim()
    if not t.is_mkldnn:
        raise InvalidOptionError(f"not a oneDNN (torch._mkldnn) tensor: layout {t.layout}")
    n = int(torch.ops.mkldnn._nbytes(t))
    if n:
        raw = (ctypes.c_ubyte * n).from_address(int(torch.ops.mkldnn.data_ptr(t)))
        data = torch.frombuffer(raw, dtype=torch.uint8)
    else:
        data = torch.empty(0, dtype=torch.uint8)
    md = torch.ops.mkldnn._get_mkldnn_serialized_md(t).to(torch.uint8).contiguous().clone()
    # NOTE: what import_packed will check, checked here (and the probe it needs remembered
    # now, by the compile, not by the warm start that imports)
    start, codes = _dtype_field()
    if t.dtype not in codes or bytes(md[start : start + 4].tolist()) != codes[t.dtype]:
        raise PackedUnavailable(f"the descriptor of a {t.dtype} weight does not say {t.dtype}")
    return data, md


def import_packed(
    data: torch.Tensor, md: torch.Tensor, shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """The ``torch._mkldnn`` tensor of ``export_packed``'s ``(data, md)``: it reads ``data``'s
    memory in place, so the caller keeps ``data`` alive as long as the result."""
    create, codes, steal, capsule = _shim()
    if dtype not in codes:
        raise PackedUnavailable(f"no prepacked weights of dtype {dtype}")
    if data.dtype != torch.uint8 or md.dtype != torch.uint8:
        raise StoreFormatError(f"data and md are uint8 tensors, got {data.dtype} and {md.dtype}")
    if not (data.is_contiguous() and md.is_contiguous()) or data.device.type != "cpu":
        raise StoreFormatError("data and md are contiguous CPU tensors")
    start, codes_of = _dtype_field()
    if md.numel() < start + 4 or bytes(md[start : start + 4].tolist()) != codes_of[dtype]:
        raise StoreFormatError(f"the descriptor does not describe {dtype} data")
    dims = [int(d) for d in shape]
    strides, step = [0] * len(dims), 1
    for i in range(len(dims) - 1, -1, -1):
        strides[i], step = step, step * max(dims[i], 1)
    handle = ctypes.c_void_p()
    rc = create(
        data.data_ptr(), len(dims), (ctypes.c_int64 * len(dims))(*dims),
        (ctypes.c_int64 * len(dims))(*strides), 0, codes[dtype], codes["cpu"], 0,
        ctypes.byref(handle), codes["layout"], md.data_ptr(), md.numel(),
    )  # fmt: skip
    if rc != 0 or not handle.value:
        raise PackedUnavailable(f"aoti_torch_create_tensor_from_blob_v2 failed (code {rc})")
    # NOTE: steals the handle (no leak, no double free); the tensor borrows data's memory.
    out: torch.Tensor = steal(capsule(handle.value, None, None))
    need = int(torch.ops.mkldnn._nbytes(out))
    if need != data.numel():
        raise StoreFormatError(f"{data.numel()} bytes for a descriptor of {need}")
    if list(out.shape) != dims:
        raise StoreFormatError(f"the descriptor describes shape {list(out.shape)}, not {dims}")
    return out

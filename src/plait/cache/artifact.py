"""The artifact payload: a JSON document and named tensors in one safetensors file.

What a warm start needs to skip the passes, the planner's dry runs and the C++ compiler: the
optimized graph (IR text), its constants (frozen and folded weights), the backend's saved plan
and the manifest. It is one safetensors file (``{name: tensor}`` plus a ``plait`` metadata string
holding the JSON document), so loading never unpickles and never runs code from the file.

:func:`unpack` reads the safetensors layout itself (an 8-byte length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes), checks every range against the buffer,
and builds each tensor on the buffer with ``torch.frombuffer``: no copy. Given a writable buffer
(the store's private mapping of the entry) the tensors share it; given bytes, it copies them once.

Example:
    >>> import torch
    >>> data = pack({"graph": "graph() { return }"}, {"w": torch.ones(2)})
    >>> doc, tensors = unpack(data)
    >>> doc["graph"], tensors["w"].tolist()
    ('graph() { return }', [1.0, 1.0])
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load as _load
from safetensors.torch import save as _save

FORMAT = "plait.artifact/1"
_MAX_HEADER = 100 << 20  # NOTE: safetensors' own bound on the JSON header
# NOTE: safetensors' dtype names; those this PyTorch lacks are not read.
_DTYPE_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16",
    "U32": "uint32", "U64": "uint64", "BOOL": "bool", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
}  # fmt: skip
_DTYPES: dict[str, torch.dtype] = {
    k: getattr(torch, v) for k, v in _DTYPE_NAMES.items() if hasattr(torch, v)
}


def pack(doc: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``doc`` (JSON) and ``tensors`` as safetensors bytes."""
    plain: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in sorted(tensors.items()):
        t = t.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.storage_offset() or t.untyped_storage().nbytes() != t.nbytes:
            t = t.clone()  # NOTE: safetensors refuses tensors that share or slice a storage
        seen.add(t.untyped_storage().data_ptr())
        plain[name] = t
    meta = {"format": FORMAT, "plait": json.dumps(dict(doc), sort_keys=True)}
    return _save(plain, metadata=meta)


def unpack(data: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(doc, tensors)`` of an artifact's bytes (any buffer); raises ``ValueError`` for anything
    that is not such an artifact. The tensors are built on ``data`` when it is writable (no
    copy: they keep it alive), else on one copy of it."""
    buf = memoryview(data).cast("B")
    if sys.byteorder != "little":  # pragma: no cover - NOTE: safetensors stores little-endian
        return _unpack_copy(bytes(buf))
    if buf.readonly:
        buf = memoryview(bytearray(buf))
    header, base = _header(buf)
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"artifact format {found!r}, expected {FORMAT!r}")
    tensors = {name: _tensor(buf, base, *spec) for name, spec in _specs(header, buf, base)}
    try:
        doc = json.loads(meta["plait"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"artifact document unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("artifact document is not a JSON object")
    return doc, tensors


def _header(buf: memoryview) -> tuple[dict[str, Any], int]:
    """The safetensors JSON header and where the tensor bytes start."""
    if len(buf) < 8:
        raise ValueError(f"not a safetensors artifact: {len(buf)} bytes")
    n = int.from_bytes(buf[:8], "little")
    if n > min(len(buf) - 8, _MAX_HEADER):
        raise ValueError(f"not a safetensors artifact: header of {n} bytes in {len(buf)}")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except ValueError as exc:
        raise ValueError(f"not a safetensors artifact: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError("not a safetensors artifact: header is not a JSON object")
    return header, 8 + n


def _specs(
    header: dict[str, Any], buf: memoryview, base: int
) -> list[tuple[str, tuple[torch.dtype, list[int], int, int]]]:
    """Each tensor's ``(dtype, shape, begin, end)``, checked: known dtype, sizes that match the
    byte range, ranges that tile the data section exactly (no gap, no overlap, nothing past
    the end), as safetensors itself checks."""
    out = []
    for name, info in header.items():
        try:
            dtype = _DTYPES[info["dtype"]]
            shape, offsets = info["shape"], info["data_offsets"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a safetensors artifact: tensor {name!r}: {exc!r}") from None
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"tensor {name!r}: shape {shape!r}")
        if not (isinstance(offsets, list) and [type(x) for x in offsets] == [int, int]):
            raise ValueError(f"tensor {name!r}: data_offsets {offsets!r}")
        begin, end = offsets
        size = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end or end - begin != size:
            raise ValueError(f"tensor {name!r}: bytes {begin}..{end} for {size} bytes")
        out.append((name, (dtype, shape, begin, end)))
    edge = 0
    for _, (_, _, begin, end) in sorted(out, key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != edge:
            raise ValueError(f"tensor bytes overlap or leave a gap at byte {edge}")
        edge = end
    if base + edge != len(buf):
        raise ValueError(f"tensor bytes end at {base + edge}, the artifact at {len(buf)}")
    return out


def _tensor(
    buf: memoryview, base: int, dtype: torch.dtype, shape: list[int], begin: int, end: int
) -> torch.Tensor:
    if begin == end:
        return torch.empty(shape, dtype=dtype)  # NOTE: frombuffer refuses zero elements
    t = torch.frombuffer(buf, dtype=torch.uint8, count=end - begin, offset=base + begin)
    if t.data_ptr() % dtype.itemsize:  # NOTE: an unaligned element is copied, never read so
        t = t.clone()
    return t.view(dtype).view(shape)


def _unpack_copy(data: bytes) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    try:
        tensors = _load(data)
        header_len = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + header_len])
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"not a safetensors artifact: {exc}") from None
    meta = header.get("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise ValueError(f"artifact format {meta.get('format')!r}, expected {FORMAT!r}")
    return json.loads(meta["plait"]), tensors

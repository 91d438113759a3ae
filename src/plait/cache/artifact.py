"""The artifact payload: a JSON document and named tensors in one safetensors file.

What a warm start needs to skip the passes, the planner's dry runs and the C++ compiler: the
optimized graph (IR text), its constants (frozen and folded weights), the backend's saved plan
and the manifest. It is one safetensors file (``{name: tensor}`` plus a ``plait`` metadata string
holding the JSON document), so loading never unpickles and never runs code from the file.

:func:`unpack` reads the safetensors layout itself (an 8-byte length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes), checks every range against the buffer,
and builds each tensor on the buffer with ``torch.frombuffer``: no copy. Given a writable buffer
(the store's private mapping of the entry) the tensors share it; given bytes, it copies them once.

:func:`pack_pieces` writes the same layout as buffers to be written in order (the header, then
each tensor's own memory): a save copies no tensor. The files are ordinary safetensors files
(``safetensors.torch.load`` reads them).

*Blobs* (byte tensors that native code reads in place: oneDNN's prepacked weights) go into one
arena tensor, each at a multiple of :data:`ALIGN` bytes from the start of the data section, which
itself starts :data:`ALIGN`-aligned (the header is padded with spaces, as the safetensors format
allows): in an entry whose payload starts aligned (the store's, since its format 2), every blob
is aligned.

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

from plait.errors import InternalValueError, StoreFormatError

FORMAT = "plait.artifact/1"
ALIGN = 64
ARENA = "plait.arena"
_COMPLEX128 = "complex128"  # NOTE: metadata key: names of tensors stored as view_as_real pairs
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
_NAMES = {v: k for k, v in _DTYPES.items()}


def pack(
    doc: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    blobs: Mapping[str, torch.Tensor] | None = None,
) -> bytes:
    """``doc`` (JSON), ``tensors`` and ``blobs`` (uint8 tensors, each stored
    :data:`ALIGN`-aligned) as safetensors bytes (:func:`pack_pieces`, joined)."""
    return b"".join(pack_pieces(doc, tensors, blobs))


def pack_pieces(
    doc: Mapping[str, Any],
    tensors: Mapping[str, torch.Tensor],
    blobs: Mapping[str, torch.Tensor] | None = None,
) -> list[memoryview]:
    """The artifact as buffers to be written in order: the header, then each tensor's own
    memory (no copy: the caller keeps ``tensors`` and ``blobs`` unchanged until written)."""
    blobs = dict(blobs or {})
    if ARENA in tensors or ARENA in blobs:
        raise InternalValueError(f"{ARENA!r} names the blob arena; no tensor or blob may take it")
    clash = sorted(set(blobs) & set(tensors))
    if clash:
        raise InternalValueError(f"blob names {clash} are also tensor names")
    meta = {"format": FORMAT, "plait": json.dumps(dict(doc), sort_keys=True)}
    header: dict[str, Any] = {}
    body: list[memoryview] = []
    edge = 0
    if blobs:
        # NOTE: the arena leads the data section (which starts aligned), and each blob starts
        # at a multiple of ALIGN within it, zero-padded.
        index = {}
        for name, b in sorted(blobs.items()):
            if b.dtype != torch.uint8 or b.dim() != 1 or not b.is_contiguous():
                raise InternalValueError(f"blob {name!r} is not a contiguous 1-d uint8 tensor")
            index[name] = [edge, edge + b.numel()]
            body.append(_bytes_of(b))
            edge += b.numel()
            pad = -edge % ALIGN
            body.append(memoryview(bytes(pad)))
            edge += pad
        if edge == 0:
            body.append(memoryview(bytes(ALIGN)))
            edge = ALIGN
        header[ARENA] = {"dtype": "U64", "shape": [edge // 8], "data_offsets": [0, edge]}
        meta["arena"] = json.dumps(index, sort_keys=True)
    # NOTE: widest elements first (as safetensors orders them): every tensor starts at a
    # multiple of its element size, so none is copied to be read.
    widened = sorted(k for k, t in tensors.items() if t.dtype == torch.complex128)
    if widened:
        meta[_COMPLEX128] = json.dumps(widened)
    for name, t in sorted(tensors.items(), key=lambda kv: (-kv[1].element_size(), kv[0])):
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.complex128:
            t = torch.view_as_real(t)  # NOTE: 16-byte elements lead, so it starts 16-aligned
        if t.dtype not in _NAMES:
            raise InternalValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        header[name] = {
            "dtype": _NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [edge, edge + t.nbytes],
        }
        body.append(_bytes_of(t))
        edge += t.nbytes
    text = json.dumps({"__metadata__": meta, **header}, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # NOTE: the format allows trailing spaces
    return [memoryview(len(text).to_bytes(8, "little") + text), *body]


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, as a view of its memory (it stays referenced)."""
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy().data).cast("B")


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
        raise StoreFormatError(f"artifact format {found!r}, expected {FORMAT!r}")
    tensors = {name: _tensor(buf, base, *spec) for name, spec in _specs(header, buf, base)}
    if _COMPLEX128 in meta:
        tensors.update(_complex128(tensors, meta[_COMPLEX128]))
    if "arena" in meta:
        tensors.update(_blobs(tensors.pop(ARENA, None), meta["arena"], tensors))
    try:
        doc = json.loads(meta["plait"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreFormatError(f"artifact document unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise StoreFormatError("artifact document is not a JSON object")
    return doc, tensors


def _complex128(tensors: Mapping[str, torch.Tensor], names_json: Any) -> dict[str, torch.Tensor]:
    """The complex128 tensors (safetensors has no such dtype: each is stored as float64 pairs,
    ``view_as_real``) read back as complex128."""
    try:
        names = json.loads(names_json)
    except (TypeError, ValueError) as exc:
        raise StoreFormatError(f"artifact complex128 index unreadable: {exc!r}") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise StoreFormatError(f"artifact complex128 index is not a list of names: {names!r}")
    out: dict[str, torch.Tensor] = {}
    for name in names:
        t = tensors.get(name)
        if t is None or t.dtype != torch.float64 or t.dim() == 0 or t.shape[-1] != 2:
            raise StoreFormatError(
                f"artifact complex128 tensor {name!r} is not stored as float64 pairs"
            )
        out[name] = torch.view_as_complex(t if t.data_ptr() % 16 == 0 else t.clone())
    return out


def _blobs(
    arena: torch.Tensor | None, index_json: Any, tensors: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The blobs of an arena, checked against it (and named apart from ``tensors``); each is
    ALIGN-aligned in memory (one that is not, in a buffer that is not, is copied to memory
    that is)."""
    try:
        index = json.loads(index_json)
        ranges = {str(k): (int(v[0]), int(v[1])) for k, v in index.items()}
    except (TypeError, ValueError, IndexError, AttributeError) as exc:
        raise StoreFormatError(f"artifact blob index unreadable: {exc!r}") from None
    clash = sorted(set(ranges) & set(tensors))
    if clash:
        raise StoreFormatError(f"artifact blob index names tensors {clash}")
    if arena is None or arena.dtype != torch.uint64:
        raise StoreFormatError("artifact blob index without its uint64 arena")
    raw = arena.view(torch.uint8)
    out = {}
    for name, (begin, end) in ranges.items():
        if not (0 <= begin <= end <= raw.numel() and begin % ALIGN == 0):
            raise StoreFormatError(
                f"blob {name!r}: bytes {begin}..{end} of an arena of {raw.numel()}"
            )
        blob = raw[begin:end]
        if blob.data_ptr() % ALIGN:
            aligned = torch.empty(end - begin, dtype=torch.uint8)
            blob = aligned.copy_(blob)
        out[name] = blob
    return out


def _header(buf: memoryview) -> tuple[dict[str, Any], int]:
    """The safetensors JSON header and where the tensor bytes start."""
    if len(buf) < 8:
        raise StoreFormatError(f"not a safetensors artifact: {len(buf)} bytes")
    n = int.from_bytes(buf[:8], "little")
    if n > min(len(buf) - 8, _MAX_HEADER):
        raise StoreFormatError(f"not a safetensors artifact: header of {n} bytes in {len(buf)}")
    try:
        header = json.loads(bytes(buf[8 : 8 + n]))
    except ValueError as exc:
        raise StoreFormatError(f"not a safetensors artifact: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise StoreFormatError("not a safetensors artifact: header is not a JSON object")
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
            raise StoreFormatError(
                f"not a safetensors artifact: tensor {name!r}: {exc!r}"
            ) from None
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise StoreFormatError(f"tensor {name!r}: shape {shape!r}")
        if not (isinstance(offsets, list) and [type(x) for x in offsets] == [int, int]):
            raise StoreFormatError(f"tensor {name!r}: data_offsets {offsets!r}")
        begin, end = offsets
        size = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end or end - begin != size:
            raise StoreFormatError(f"tensor {name!r}: bytes {begin}..{end} for {size} bytes")
        out.append((name, (dtype, shape, begin, end)))
    edge = 0
    for _, (_, _, begin, end) in sorted(out, key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != edge:
            raise StoreFormatError(f"tensor bytes overlap or leave a gap at byte {edge}")
        edge = end
    if base + edge != len(buf):
        raise StoreFormatError(f"tensor bytes end at {base + edge}, the artifact at {len(buf)}")
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
        raise StoreFormatError(f"not a safetensors artifact: {exc}") from None
    meta = header.get("__metadata__", {})
    if meta.get("format") != FORMAT:
        raise StoreFormatError(f"artifact format {meta.get('format')!r}, expected {FORMAT!r}")
    if "arena" in meta:
        tensors.update(_blobs(tensors.pop(ARENA, None), meta["arena"], tensors))
    return json.loads(meta["plait"]), tensors

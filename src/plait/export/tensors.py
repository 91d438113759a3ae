"""Tensors in an artifact: safetensors members, written by the safetensors library and read
only after every declared dtype, shape and byte range was checked against the bytes.

:func:`read_tensors` parses the header itself first (an 8-byte length, capped; a JSON object;
each tensor's dtype, shape and ``data_offsets``), checks that each tensor's byte length is its
shape times its element size, that the ranges tile the data section exactly, and, where the
caller declares what it expects (the program's input types), that the names, dtypes and shapes
are those: only then does ``safetensors.torch.load`` decode it. No pickle, no allocation sized
by an unchecked number.

Example:
    >>> import torch
    >>> data = write_tensors({"w": torch.ones(2, 3)})
    >>> read_tensors("weights.safetensors", data, {"w": (torch.float32, (2, 3))})["w"].shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import load as _load
from safetensors.torch import save as _save

from plait.errors import ArtifactFormatError, ExportError

_MAX_HEADER = 100 << 20  # NOTE: safetensors' own bound on its JSON header
# NOTE: the safetensors dtype names this format uses, and the torch dtypes they read as
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip
NAMES = {v: k for k, v in DTYPES.items()}
Expected = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]


def write_tensors(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``tensors`` (CPU copies, contiguous) as safetensors bytes; raises ``ValueError`` for a
    dtype the format does not carry."""
    out = {}
    for name, t in sorted(tensors.items()):
        if t.dtype not in NAMES:
            raise ExportError(f"tensor {name!r}: dtype {t.dtype} is not carried by the format")
        out[name] = t.detach().cpu().contiguous().clone()
    return _save(out, metadata={"format": "pt"})


def read_tensors(
    member: str, data: bytes, expected: Expected | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors member, checked (see the module doc); ``expected``: the
    exact names with their dtype and shape (None: any)."""
    header = _header(member, data)
    specs = _specs(member, header, len(data) - 8 - _header_length(data))
    if expected is not None:
        _check_expected(member, specs, expected)
    try:
        tensors = _load(data)
    except Exception as exc:  # NOTE: safetensors raises its own error types
        raise ArtifactFormatError(f"{member}: safetensors refused it ({exc})") from None
    for name, (dtype, shape) in specs.items():
        t = tensors.get(name)
        if t is None or t.dtype != dtype or tuple(t.shape) != shape:
            raise ArtifactFormatError(f"{member}: tensor {name} did not decode as declared")
    return tensors


def _header_length(data: bytes) -> int:
    return int.from_bytes(data[:8], "little")


def _header(member: str, data: bytes) -> dict[str, Any]:
    if len(data) < 8:
        raise ArtifactFormatError(f"{member}: {len(data)} bytes, not a safetensors file")
    n = _header_length(data)
    if n > min(len(data) - 8, _MAX_HEADER):
        raise ArtifactFormatError(
            f"{member}: declares a header of {n} bytes in a file of {len(data)}"
        )
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactFormatError(f"{member}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ArtifactFormatError(f"{member}: header is not a JSON object")
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ArtifactFormatError(f"{member}: __metadata__ is not an object of strings")
    return header


def _specs(
    member: str, header: dict[str, Any], body: int
) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    out: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    ranges = []
    for name, info in header.items():
        where = f"{member}: tensor {name}"
        if not isinstance(info, dict):
            raise ArtifactFormatError(f"{where}: its entry is not an object")
        dtype = DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
        if dtype is None:
            raise ArtifactFormatError(f"{where}: dtype {info.get('dtype')!r} is not carried")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ArtifactFormatError(f"{where}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offsets, list) and [type(x) for x in offsets] == [int, int]):
            raise ArtifactFormatError(f"{where}: data_offsets {offsets!r} are not two integers")
        begin, end = offsets
        size = math.prod(shape) * dtype.itemsize  # NOTE: Python ints: no overflow
        if not 0 <= begin <= end or end - begin != size:
            raise ArtifactFormatError(
                f"{where}: {dtype_text(dtype)}{shape} is {size} bytes, its data_offsets "
                f"{begin}..{end} hold {end - begin}"
            )
        out[name] = (dtype, tuple(shape))
        ranges.append((begin, end, name))
    edge = 0
    for begin, end, name in sorted(ranges):
        if begin != edge:
            raise ArtifactFormatError(
                f"{member}: tensor {name} starts at byte {begin}; the data before ends at {edge}"
            )
        edge = end
    if edge != body:
        raise ArtifactFormatError(f"{member}: tensor data ends at byte {edge} of {body}")
    return out


def _check_expected(
    member: str, specs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], expected: Expected
) -> None:
    missing, extra = sorted(set(expected) - set(specs)), sorted(set(specs) - set(expected))
    if missing:
        raise ArtifactFormatError(f"{member}: missing tensors {missing}")
    if extra:
        raise ArtifactFormatError(f"{member}: tensors nothing declares: {extra}")
    for name, (dtype, shape) in expected.items():
        got = specs[name]
        if got != (dtype, tuple(shape)):
            raise ArtifactFormatError(
                f"{member}: tensor {name} is {dtype_text(got[0])}{list(got[1])}, the program "
                f"declares {dtype_text(dtype)}{list(shape)}"
            )


def dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

"""Sampled values of a frozen tensor: what sees a write through ``weight.data``.

A frozen tensor (a parameter or buffer the compile made a graph constant) is guarded by its
identity, version counter and storage address. A write through ``weight.data``
(``p.data.clamp_(-c, c)``, ``p.data.mul_(2)``, ``p.data.copy_(other)``) changes none of them:
``.data`` is a new tensor on the same storage with a version counter of its own. So the guard
also reads the tensor's first :data:`COUNT` elements and compares their bits with the ones read
when the constant was frozen (the native evaluator compares a 64-bit digest of them), together
with the tensor's strides and dtype (``weight.data = weight.data.t()`` keeps the storage).

NOTE: a sample, not the values: a write that changes none of the sampled elements (a few
elements set through ``.data``, ``p.data[1:] = ...``) is not seen. Any failed guard recompiles
the whole program, so a write through ``.data`` to several tensors is seen when it changes a
sampled element of any. The first elements, not elements spread over the tensor: a dense
tensor's are one cache line, so the check costs one memory read per tensor, where spread samples
would cost one cache miss each. CPU tensors only (reading a GPU tensor's values would synchronize
the device).

Example:
    >>> import torch
    >>> w = torch.randn(4, 4)
    >>> s = take_sample(w)
    >>> reading(w, s) == s.raw
    True
    >>> _ = w.data.mul_(2)  # no version counter of w sees this
    >>> reading(w, s) == s.raw
    False
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

import torch

COUNT = 8  # NOTE: the first elements read of each tensor (all of them for a smaller tensor)
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
_FMIX = 0xFF51AFD7ED558CCD
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # NOTE: a subclass may hold its values elsewhere


@dataclass(frozen=True)
class Sample:
    """Where a tensor's sampled elements are (byte offsets from its data pointer, ``size`` bytes
    read at each), the geometry that makes those offsets valid, the bytes read there when the
    constant was frozen, and their digest (what the native evaluator compares)."""

    ptr: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offsets: tuple[int, ...]
    size: int  # NOTE: bytes read at each offset, at most 8 (a complex128 element's real part)
    raw: bytes
    digest: int
    end: int  # NOTE: the last byte read, plus one
    dense: bool  # NOTE: the offsets are consecutive elements: one read


def take_sample(t: torch.Tensor) -> Sample | None:
    """The sample of ``t`` as it is now, or None where its values are not sampled (not a plain
    dense CPU tensor, or empty)."""
    if type(t) not in _PLAIN or t.layout != torch.strided:
        return None
    if not t.is_cpu or t.numel() == 0 or t.is_quantized:
        return None
    item = t.element_size()
    count = min(COUNT, t.numel())
    if t.is_contiguous():  # NOTE: the row-major n-th element is n elements on (unit dims aside)
        offsets = [n * item for n in range(count)]
    else:
        offsets = []
        for flat in range(count):
            off = 0
            for d in range(t.dim() - 1, -1, -1):
                flat, i = divmod(flat, t.shape[d])
                off += i * t.stride(d)
            offsets.append(off * item)
    size = min(item, 8)
    dense = all(b - a == size for a, b in itertools.pairwise(offsets))
    raw = _raw(t.data_ptr(), tuple(offsets), size, dense)
    return Sample(
        t.data_ptr(),
        t.dtype,
        tuple(t.shape),
        tuple(t.stride()),
        tuple(offsets),
        size,
        raw,
        digest(raw, size),
        max(offsets) + size,
        dense,
    )


def reading(t: object, s: Sample) -> bytes | None:
    """The bytes at ``s``'s offsets of ``t`` now, or None where ``t`` is no longer laid out as
    ``s`` was taken (then no offset is read: it might lie outside the storage)."""
    if type(t) not in _PLAIN:
        return None
    assert isinstance(t, torch.Tensor)
    if t.layout != torch.strided or not t.is_cpu or t.data_ptr() != s.ptr:
        return None
    if t.dtype != s.dtype or t.stride() != s.strides or t.shape != s.shape:
        return None
    if s.end > t.untyped_storage().nbytes() - t.storage_offset() * t.element_size():
        return None
    return _raw(s.ptr, s.offsets, s.size, s.dense)


def values_now(t: torch.Tensor) -> bytes | None:
    """The bytes of ``t``'s sampled elements as they are now (None where they are not
    sampled): what a prepared copy of a caller's weight is compared by between calls."""
    if type(t) not in _PLAIN or t.layout != torch.strided:
        return None
    if not t.is_cpu or t.numel() == 0 or t.is_quantized:
        return None
    item = t.element_size()
    if item <= 8 and t.is_contiguous():
        return ctypes.string_at(t.data_ptr(), min(COUNT, t.numel()) * item)
    s = take_sample(t)
    return None if s is None else s.raw


def digest(raw: bytes, size: int) -> int:
    """FNV-1a over the words of ``raw`` (each ``size`` bytes, little-endian), each mixed first
    (the native evaluator computes the same from the memory it reads)."""
    h = _FNV_OFFSET
    for k in range(0, len(raw), size):
        word = int.from_bytes(raw[k : k + size], "little")
        # NOTE: MurmurHash3's finalizer: in plain FNV a flipped top bit flips the digest's top
        # bit, so a negation of an even count of elements cancelled out
        word ^= word >> 33
        word = (word * _FMIX) & _MASK
        word ^= word >> 33
        h = ((h ^ word) * _FNV_PRIME) & _MASK
    return h


def _raw(ptr: int, offsets: tuple[int, ...], size: int, dense: bool) -> bytes:
    """The ``size`` bytes at each of ``offsets`` from ``ptr``, in order (``dense``: the offsets
    are consecutive, read at once)."""
    if dense:
        return ctypes.string_at(ptr + offsets[0], size * len(offsets))
    return b"".join(ctypes.string_at(ptr + o, size) for o in offsets)

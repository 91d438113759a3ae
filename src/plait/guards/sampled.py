"""Sampled values of a frozen tensor: what sees a write through ``weight.data``.

A frozen tensor (a parameter or buffer the compile made a graph constant) is guarded by its
identity, version counter and storage address. A write through ``weight.data``
(``p.data.clamp_(-c, c)``, ``p.data.mul_(2)``, ``p.data.copy_(other)``) changes none of them:
``.data`` is a new tensor on the same storage with a version counter of its own. So the guard
also reads the tensor's first :data:`COUNT` elements and compares a digest of their bits with the
one taken when the constant was frozen, together with the tensor's strides and dtype
(``weight.data = weight.data.t()`` keeps the storage).

NOTE: a sample, not the values: a write that changes none of the sampled elements (a few
elements set through ``.data``, ``p.data[1:] = ...``) is not seen. Any failed guard recompiles
the whole program, so a write through ``.data`` to several tensors is seen when it changes a
sampled element of any. The first elements, not elements spread over the tensor: a dense
tensor's are one cache line, so the check costs one memory read per tensor (spread samples cost
ResNet-18's guards 90 us a call, against 4 us). CPU tensors only (reading a GPU tensor's values
would synchronize the device).

Example:
    >>> import torch
    >>> w = torch.randn(4, 4)
    >>> s = take_sample(w)
    >>> reading(w, s) == s.digest
    True
    >>> _ = w.data.mul_(2)  # no version counter of w sees this
    >>> reading(w, s) == s.digest
    False
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

COUNT = 8  # NOTE: the first elements read of each tensor (all of them for a smaller tensor)
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
_FMIX = 0xFF51AFD7ED558CCD
_ONE_READ = 256  # NOTE: offsets spanning at most this many bytes are read in one copy


@dataclass(frozen=True)
class Sample:
    """Where a tensor's sampled elements are (byte offsets from its data pointer, each read as
    ``size`` little-endian bytes), the geometry that makes those offsets valid, and the digest
    of the bits read there when the constant was frozen."""

    ptr: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offsets: tuple[int, ...]
    size: int  # NOTE: bytes read at each offset, at most 8 (a complex128 element's real part)
    digest: int


def take_sample(t: torch.Tensor) -> Sample | None:
    """The sample of ``t`` as it is now, or None where its values are not sampled (not a plain
    dense CPU tensor, or empty)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
        return None
    if t.device.type != "cpu" or t.numel() == 0 or t.is_quantized:
        return None
    picks = range(min(COUNT, t.numel()))
    item = t.element_size()
    offsets = []
    for flat in picks:
        off = 0
        for d in range(t.dim() - 1, -1, -1):
            flat, i = divmod(flat, t.shape[d])
            off += i * t.stride(d)
        offsets.append(off * item)
    size = min(item, 8)
    digest = _digest(t.data_ptr(), tuple(offsets), size)
    return Sample(
        t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()), tuple(offsets), size, digest
    )


def reading(t: object, s: Sample) -> int | None:
    """The digest of ``t``'s bits at ``s``'s offsets, or None where ``t`` is no longer laid out
    as ``s`` was taken (then no offset is read: it might lie outside the storage)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    assert isinstance(t, torch.Tensor)
    if t.device.type != "cpu" or t.layout != torch.strided or t.dtype != s.dtype:
        return None
    if t.data_ptr() != s.ptr or tuple(t.shape) != s.shape or tuple(t.stride()) != s.strides:
        return None
    span = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    if max(s.offsets) + s.size > span:
        return None
    return _digest(s.ptr, s.offsets, s.size)


def digest_now(t: torch.Tensor) -> int | None:
    """The digest of ``t``'s sampled elements as they are now (None where they are not
    sampled): what a prepared copy of a caller's weight is compared by between calls."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
        return None
    if t.device.type != "cpu" or t.numel() == 0 or t.is_quantized:
        return None
    item = t.element_size()
    if item <= 8 and t.is_contiguous():
        return _digest(t.data_ptr(), tuple(range(0, min(COUNT, t.numel()) * item, item)), item)
    s = take_sample(t)
    return None if s is None else s.digest


def _digest(ptr: int, offsets: tuple[int, ...], size: int) -> int:
    """FNV-1a over mixed 64-bit words: each word the ``size`` bytes at ``ptr + offset``, read as
    a little-endian unsigned integer (the native evaluator computes the same)."""
    lo, hi = min(offsets), max(offsets) + size
    if hi - lo <= _ONE_READ:  # NOTE: a dense tensor's first elements: one read
        block = ctypes.string_at(ptr + lo, hi - lo)
        words = [int.from_bytes(block[o - lo : o - lo + size], "little") for o in offsets]
    else:
        words = [int.from_bytes(ctypes.string_at(ptr + o, size), "little") for o in offsets]
    h = _FNV_OFFSET
    for word in words:
        # NOTE: each word mixed first (MurmurHash3's finalizer): in plain FNV a flipped top bit
        # flips the digest's top bit, so a negation of an even count of elements cancelled out
        word ^= word >> 33
        word = (word * _FMIX) & _MASK
        word ^= word >> 33
        h = ((h ^ word) * _FNV_PRIME) & _MASK
    return h

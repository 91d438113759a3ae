"""The frozen weights' digests (the key's ``weights`` part), per tensor, prefetched.

A warm start must hash the frozen weights before it can name its cache entry: ResNet-18's 45 MB,
3-5 ms on the 2-core development machine. :func:`prefetch` starts that at the top of the call,
on a native background thread (:mod:`plait.codegen.native_hash`), while the snapshot is read;
:func:`weights_digest` then only waits for what is left.

Invariants: a prefetched digest serves only the key of the compile step that prefetched it
(each step starts with :func:`forget`), only for the very tensor it was
taken of (a weak reference, checked: an id reused by a new tensor is never taken for the old
one) and only while its version counter, storage and layout are unchanged (an in-place write
bumps the version). NOTE: never across compiles: a write through ``weight.data`` or a NumPy
view of the weight bumps no version counter, so a digest kept from an earlier compile could
name the entry folded from the old values; every compile hashes the weights as they are. The
text :func:`weights_digest` returns equals :func:`plait.ir.weights_hash`'s, whichever path
computed each tensor's digest.

Example:
    >>> import torch
    >>> from plait.ir import weights_hash
    >>> w = {"w": torch.randn(4, 4)}
    >>> prefetch(list(w.values()))
    >>> weights_digest(w) == weights_hash(w)
    True
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plait.codegen import native_hash
from plait.codegen.extern import written
from plait.ir.identity import tensor_buffer, weights_hash


@dataclass
class _Known:
    ref: weakref.ref[torch.Tensor]
    state: tuple[Any, ...]
    job: native_hash.DigestJob
    index: int


_KNOWN: dict[int, _Known] = {}
_LIMIT = 4096


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    return (*written(t), t.dtype, tuple(t.shape), t.stride(), t.storage_offset())


def _lookup(t: torch.Tensor) -> _Known | None:
    known = _KNOWN.get(id(t))
    if known is None or known.ref() is not t or known.state != _state(t):
        return None
    return known


def _stream(t: torch.Tensor) -> list[Any]:
    span = native_hash.tensor_span(t)
    return [span] if span is not None else [tensor_buffer(t)]


def _remember(tensors: Sequence[torch.Tensor], threads: int) -> native_hash.DigestJob:
    job = native_hash.start([_stream(t) for t in tensors], threads, keep=list(tensors))
    if len(_KNOWN) + len(tensors) > _LIMIT:
        for key in [k for k, v in _KNOWN.items() if v.ref() is None]:
            del _KNOWN[key]
        if len(_KNOWN) + len(tensors) > _LIMIT:
            _KNOWN.clear()
    for i, t in enumerate(tensors):
        _KNOWN[id(t)] = _Known(weakref.ref(t), _state(t), job, i)
    return job


def _plain_cpu(t: Any) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu"


def prefetch(tensors: Sequence[Any]) -> None:
    """Start hashing, in the background, the CPU tensors among ``tensors`` (on one native
    thread per two cores: the caller keeps a core for its own work), for the key of this
    compile step (which :func:`forget` began)."""
    if not native_hash.status().available:
        return  # NOTE: no background threads: hash only the frozen weights, when they are known
    todo = [t for t in tensors if _plain_cpu(t)]
    if todo:
        _remember(todo, max(1, (os.cpu_count() or 2) // 2))


def forget() -> None:
    """Begin a compile step: the digests an earlier one prefetched are never used by it."""
    _KNOWN.clear()


def weights_digest(weights: Mapping[str, torch.Tensor]) -> str:
    """:func:`plait.ir.weights_hash` of ``weights`` (``"none"`` when there are none), from the
    per-tensor digests this compile step prefetched, where there are any."""
    if not weights:
        return "none"
    digests: dict[str, bytes] = {}
    missing = []
    for name, t in weights.items():
        known = _lookup(t) if _plain_cpu(t) else None
        if known is None:
            missing.append(name)
        else:
            digests[name] = known.job.result()[known.index]
    plain = [n for n in missing if _plain_cpu(weights[n])]
    if plain:
        tensors = [weights[n] for n in plain]
        job = native_hash.start([_stream(t) for t in tensors], os.cpu_count() or 1, keep=tensors)
        digests.update(zip(plain, job.result()))
    return weights_hash(weights, digests)


__all__ = ["forget", "prefetch", "weights_digest"]

"""Chunk digests on native threads: the content hash without the GIL, in the background.

:func:`plait.ir.chunked_hash.stream_digest` cuts a byte stream into ``CHUNK``-byte chunks and
hashes them on a Python thread pool; each chunk needs the GIL to start, and a thread waiting for
the GIL waits up to the interpreter's switch interval (5 ms) while the main thread runs Python.
So that pool helps only while the main thread waits. Here the chunks are hashed by POSIX threads
of a small C library, which never touch the interpreter: :func:`start` returns at once, the
calling thread goes on with its Python work, and :meth:`DigestJob.result` waits (without the
GIL) for the digests. A warm start hashes the frozen weights this way while it reads its
snapshot.

Invariants: the digests equal :func:`~plait.ir.chunked_hash.stream_digest`'s, bit for bit, on
either path (the C code calls the XXH3 functions of the ``xxhash`` package's own extension, found
by name, and the streams are cut into chunks by the same Python code). Where the library cannot
be built or loaded (no compiler, ``PLAIT_STAX_NO_COMPILE=1`` before it was built,
``PLAIT_NATIVE_HASH=0``, an ``xxhash`` without those symbols), :func:`start` hashes at once on
the Python pool and :func:`status` says why; nothing else differs. The buffers must not change
until :meth:`DigestJob.result` returns (the job holds references to them). A job started before
``fork`` is recomputed in the child, where its threads do not exist.

The library (its C source is ``csrc/native_hash.cpp``, package data) is built once per machine
and toolchain, like the guard evaluator, into the same per-installation directory
(:func:`plait.codegen.build.installation_dir`).

Example:
    >>> data = bytes(range(256)) * 100_000
    >>> job = start([[data], [data[:1000]]])
    >>> job.result() == [stream_digest([data]), stream_digest([data[:1000]])]
    True
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import torch
import xxhash

from plait.codegen import build
from plait.codegen.errors import BuildError
from plait.errors import NativeUnavailableError
from plait.ir.chunked_hash import CHUNK, chunk_layout, combine, stream_digest


def source() -> str:
    """The library's C source as shipped (``csrc/native_hash.cpp``; its cache key hashes this
    text, so an edit rebuilds it)."""
    return resources.files("plait.codegen").joinpath("csrc", "native_hash.cpp").read_text()


FLAGS = ("-O2", "-pthread")
SYMBOLS = ("plait_hash_init", "plait_hash_start", "plait_hash_join")
_XXH = ("XXH3_createState", "XXH3_freeState", "XXH3_128bits_reset")
_XXH_MORE = ("XXH3_128bits_update", "XXH3_128bits_digest")


@dataclass
class Status:
    """Whether chunks are hashed on native threads, and if not, why."""

    available: bool = False
    reason: str = "not loaded yet"


_STATUS = Status()
_LIB: list[ctypes.CDLL] = []
_LOCK = threading.Lock()


def status() -> Status:
    """The native hasher's status in this process (loads it if no one tried yet)."""
    _load()
    return _STATUS


def _load() -> ctypes.CDLL | None:
    if _LIB:
        return _LIB[0]
    with _LOCK:
        if _LIB or _STATUS.reason != "not loaded yet":
            return _LIB[0] if _LIB else None
        try:
            _LIB.append(_build_and_load())
            _STATUS.available, _STATUS.reason = True, "native"
        except (BuildError, OSError, AttributeError, RuntimeError) as exc:
            _STATUS.reason = f"python pool: native hasher unavailable ({type(exc).__name__}: {exc})"
    return _LIB[0] if _LIB else None


def _build_and_load() -> ctypes.CDLL:
    if os.environ.get("PLAIT_NATIVE_HASH", "1") == "0":
        raise NativeUnavailableError("disabled by PLAIT_NATIVE_HASH=0")
    xxh = ctypes.CDLL(xxhash._xxhash.__file__)  # type: ignore[attr-defined]
    funcs = [ctypes.cast(getattr(xxh, name), ctypes.c_void_p).value for name in _XXH + _XXH_MORE]
    lib = build.installed_library("plait_hash", source(), SYMBOLS, flags=FLAGS)
    lib.plait_hash_init.argtypes = [ctypes.c_void_p] * 5
    lib.plait_hash_init.restype = None
    lib.plait_hash_start.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int]
    lib.plait_hash_start.restype = ctypes.c_void_p
    lib.plait_hash_join.argtypes = [ctypes.c_void_p]
    lib.plait_hash_join.restype = ctypes.c_int
    lib.plait_hash_init(*funcs)
    return lib


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data) if len(view) else 0


Span = tuple[int, int]  # NOTE: (address, length) of bytes that an owner the job holds keeps alive


def tensor_span(t: torch.Tensor) -> Span | None:
    """The bytes of a contiguous CPU tensor as a span (its own memory, no view built); None for
    any other tensor (hash :func:`~plait.ir.identity.tensor_buffer` of it instead)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        return None
    return (t.data_ptr(), t.numel() * t.element_size())


class DigestJob:
    """The digests of several byte streams, computed on native threads (or, where those are not
    available, already computed on the Python pool). :meth:`result`: one 16-byte digest per
    stream, in order. A stream is a sequence of bytes-like objects or of :data:`Span` s whose
    memory ``keep`` keeps alive."""

    def __init__(self, streams: Sequence[Sequence[Any]], threads: int, keep: Any = None) -> None:
        self._keep = keep
        self._streams = [[_part(b) for b in s] for s in streams]
        self._digests: list[bytes] | None = None
        self._handle: int | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        lib = _load()
        if lib is None:
            self._digests = self._python()
            return
        ptrs: list[int] = []
        lens: list[int] = []
        firsts = [0]
        self._counts = []
        for stream in self._streams:
            spans = [p if isinstance(p, tuple) else (_address(p), len(p)) for p in stream]
            layout = chunk_layout([n for _, n in spans])
            self._counts.append(len(layout))
            for chunk in layout:
                for i, at, n in chunk:
                    ptrs.append(spans[i][0] + at)
                    lens.append(n)
                firsts.append(len(ptrs))
        n = len(firsts) - 1
        self._ptrs = (ctypes.c_uint64 * max(1, len(ptrs)))(*ptrs)
        self._lens = (ctypes.c_uint64 * max(1, len(lens)))(*lens)
        self._first = (ctypes.c_int64 * len(firsts))(*firsts)
        self._out = ctypes.create_string_buffer(16 * max(1, n))
        self._lib = lib
        self._handle = lib.plait_hash_start(
            self._ptrs, self._lens, self._first, n, self._out, max(1, threads)
        )
        if not self._handle:
            self._digests = self._python()

    def _python(self) -> list[bytes]:
        return [stream_digest([_view(p) for p in s]) for s in self._streams]

    def result(self) -> list[bytes]:
        """The streams' digests (waits for the threads, without holding the GIL)."""
        with self._lock:
            if self._digests is None:
                self._digests = self._finish()
            return self._digests

    def _finish(self) -> list[bytes]:
        handle, self._handle = self._handle, None
        if os.getpid() != self._pid or handle is None:  # NOTE: forked: the threads are gone
            return self._python()
        if not self._lib.plait_hash_join(handle):
            return self._python()
        raw = self._out.raw
        out, pos = [], 0
        for stream, count in zip(self._streams, self._counts):
            digests = [raw[16 * i : 16 * (i + 1)] for i in range(pos, pos + count)]
            pos += count
            out.append(combine(sum(_length(p) for p in stream), digests))
        return out

    def __del__(self) -> None:
        # NOTE: the threads read the buffers this job holds: never free them under a thread.
        if self._handle is not None and os.getpid() == self._pid:
            self._lib.plait_hash_join(self._handle)


def _part(b: Any) -> Any:
    return b if isinstance(b, tuple) else memoryview(b).cast("B")


def _length(p: Any) -> int:
    return p[1] if isinstance(p, tuple) else len(p)


def _view(p: Any) -> Any:
    if not isinstance(p, tuple):
        return p
    return (ctypes.c_char * p[1]).from_address(p[0]) if p[1] else b""


def start(
    streams: Sequence[Sequence[Any]], threads: int | None = None, keep: Any = None
) -> DigestJob:
    """Start hashing ``streams`` (each a sequence of bytes-like objects or spans, hashed as
    their concatenation) on ``threads`` native threads (default: every core, at most 8);
    ``keep``: what keeps the spans' memory alive until the job is done."""
    if threads is None:
        threads = max(1, min(8, os.cpu_count() or 1))
    return DigestJob(streams, threads, keep)


def digest(buffers: Sequence[Any]) -> bytes:
    """:func:`~plait.ir.chunked_hash.stream_digest` of ``buffers``, on native threads where
    they are available (the caller waits without the GIL)."""
    return start([buffers]).result()[0]


__all__ = ["CHUNK", "DigestJob", "Span", "Status", "digest", "start", "status", "tensor_span"]

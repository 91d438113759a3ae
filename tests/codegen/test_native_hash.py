"""Chunk digests on native threads (plait.codegen.native_hash): the same digests as the Python
chunked hash, bit for bit, for buffers and tensor spans alike; a job runs while the caller
works; a forked child, a disabled or unbuildable library and a job dropped unfinished are safe."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.codegen import native_hash
from plait.ir import chunked_hash
from plait.ir.chunked_hash import stream_digest


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunked_hash, "CHUNK", 64)


def test_the_native_library_loads_here() -> None:
    # NOTE: this machine has a compiler and xxhash: the background path is the one under test
    assert native_hash.status().available, native_hash.status().reason


@pytest.mark.usefixtures("small_chunks")
@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=400), max_size=4), min_size=1, max_size=5))
def test_digests_equal_the_python_chunked_hash(streams: list[list[bytes]]) -> None:
    assert native_hash.start(streams, threads=3).result() == [stream_digest(s) for s in streams]


def test_tensor_spans_hash_as_their_bytes() -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(n, generator=gen) for n in (0, 1, 1000, 3 * chunked_hash.CHUNK // 4)]
    tensors.append(torch.randint(0, 9, (5, 7), generator=gen, dtype=torch.int64))
    spans = [native_hash.tensor_span(t) for t in tensors]
    assert all(s is not None for s in spans)
    got = native_hash.start([[s] for s in spans], keep=tensors).result()
    want = [stream_digest([t.numpy().tobytes()]) for t in tensors]
    assert got == want
    mixed = native_hash.start([[spans[2], b"tail", spans[3]]], keep=tensors).result()
    assert mixed == [stream_digest([want_bytes(tensors[2]), b"tail", want_bytes(tensors[3])])]


def want_bytes(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


def test_spans_are_only_for_contiguous_cpu_tensors() -> None:
    t = torch.randn(4, 6)
    assert native_hash.tensor_span(t) == (t.data_ptr(), t.numel() * 4)
    assert native_hash.tensor_span(t.t()) is None


def test_a_job_runs_while_the_caller_works() -> None:
    data = os.urandom(3 * chunked_hash.CHUNK + 11)
    job = native_hash.start([[data]], threads=1)
    busy = sum(i * i for i in range(20000))  # NOTE: the GIL is held; the threads need none
    assert busy > 0
    assert job.result() == [stream_digest([data])]
    assert job.result() == [stream_digest([data])]  # NOTE: a second call answers the same


def test_every_byte_counts() -> None:
    rng = random.Random(1)
    data = bytearray(os.urandom(2 * chunked_hash.CHUNK + 5))
    base = native_hash.digest([bytes(data)])
    for at in rng.sample(range(len(data)), 8):
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        assert native_hash.digest([bytes(flipped)]) != base


def test_a_job_dropped_unfinished_is_joined_first() -> None:
    data = bytearray(os.urandom(4 * chunked_hash.CHUNK))
    for _ in range(3):
        native_hash.start([[data]], threads=2)  # NOTE: dropped at once: __del__ joins
    assert native_hash.digest([data]) == stream_digest([data])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_job_started_before_fork_is_recomputed_in_the_child() -> None:
    data = os.urandom(3 * chunked_hash.CHUNK)
    job = native_hash.start([[data]], threads=2)
    want = stream_digest([data])
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        os._exit(0 if job.result() == [want] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert job.result() == [want]


def _child(env: dict[str, str]) -> list[str]:
    code = textwrap.dedent(
        """
        import os
        from plait.codegen import native_hash
        from plait.ir.chunked_hash import stream_digest
        data = os.urandom(9_000_000)
        ok = native_hash.start([[data], [data[:7]]]).result() == [
            stream_digest([data]), stream_digest([data[:7]])]
        print(ok)
        print(native_hash.status().reason)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return out.stdout.splitlines()


def test_disabled_it_hashes_on_the_python_pool_and_says_why() -> None:
    ok, reason = _child({"PLAIT_NATIVE_HASH": "0"})
    assert ok == "True"
    assert "PLAIT_NATIVE_HASH=0" in reason


def test_unbuildable_it_hashes_on_the_python_pool_and_says_why(tmp_path: object) -> None:
    ok, reason = _child({"PLAIT_GUARDS_CACHE_DIR": str(tmp_path), "PLAIT_STAX_NO_COMPILE": "1"})
    assert ok == "True"
    assert "PLAIT_STAX_NO_COMPILE=1" in reason


def test_a_corrupt_library_is_rebuilt(tmp_path: object) -> None:
    env = {"PLAIT_GUARDS_CACHE_DIR": str(tmp_path)}
    assert _child(env) == ["True", "native"]
    (lib,) = [p for p in os.scandir(str(tmp_path)) if p.name.endswith(".so")]
    with open(lib.path, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert _child(env) == ["True", "native"]

"""The chunked XXH3-128 (plait.ir.chunked_hash): a function of the stream's bytes alone, not of
how it is split into buffers or of the threads; every byte counts."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plait.ir import chunked_hash
from plait.ir.chunked_hash import stream_digest


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: many chunks from small streams (the pool's path), as in a 45 MB entry
    monkeypatch.setattr(chunked_hash, "CHUNK", 64)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=1000), st.lists(st.integers(0, 1000), max_size=6))
def test_the_digest_does_not_depend_on_the_split(data: bytes, cuts: list[int]) -> None:
    assert stream_digest(_split(data, cuts)) == stream_digest([data])


def test_every_byte_and_the_length_count() -> None:
    rng = random.Random(0)
    data = bytes(rng.randrange(256) for _ in range(1000))
    base = stream_digest([data])
    for at in rng.sample(range(len(data)), 20):
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        assert stream_digest([bytes(flipped)]) != base
    assert stream_digest([data[:-1]]) != base
    assert stream_digest([data + b"\0"]) != base
    assert stream_digest([b""]) != stream_digest([b"\0"])


def test_the_thread_count_does_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * 7
    many = stream_digest([data])
    monkeypatch.setattr(chunked_hash, "_POOL", [])
    monkeypatch.setattr(chunked_hash.os, "cpu_count", lambda: 1)
    assert stream_digest([data]) == many

"""A cache whose ``index.lock`` another process holds and does not release (stopped with Ctrl-Z
or SIGSTOP, paused in a debugger, hung on a file system): a compile that writes the cache waits
a bounded time for the lock, then answers without updating the index, and says so. It used to
wait forever. The entry it published serves the next compile once the lock is free."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from plait.cache import LocalStore
from plait.cache import store as store_mod
from plait.cache.lookup import CacheWarning
from tests.cache.helpers import artifact_entries, convnet, run, sample, status
from tests.util import contract_tol


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """``path`` locked as another process holding the index would lock it (``flock`` on an
    open file description of its own, as filelock takes it)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _close_to_eager(model: torch.nn.Module, out: torch.Tensor, x: torch.Tensor) -> None:
    with torch.no_grad():
        expected = model(x)
    tol = contract_tol("model", torch.float32)
    torch.testing.assert_close(out, expected, rtol=tol["rtol"], atol=tol["atol"])


@pytest.fixture(autouse=True)
def short_lock_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "INDEX_LOCK_TIMEOUT", 0.2)


def test_a_compile_under_a_held_index_lock_answers_and_its_entry_serves_later(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    run(convnet(), sample(), cache)
    model, x = convnet(seed=3), sample(seed=4)
    with _held(cache / "index.lock"), pytest.warns(CacheWarning, match="index.lock") as caught:
        out, spec = run(model, x, cache)
    _close_to_eager(model, out, x)
    assert status(spec) == "miss"
    assert any("published but not indexed" in str(w.message) for w in caught)
    assert len(artifact_entries(LocalStore(cache))) == 2  # NOTE: the index takes it in now
    again, spec = run(convnet(seed=3), x, cache)
    assert status(spec) == "hit" and torch.equal(again, out)


def test_a_damaged_entry_under_a_held_index_lock_is_discarded_and_rebuilt(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    run(convnet(), sample(), cache)
    store = LocalStore(cache)
    (entry,) = artifact_entries(store)
    path = store.path(entry.key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    model, x = convnet(), sample(seed=5)
    with _held(cache / "index.lock"), pytest.warns(CacheWarning) as caught:
        out, spec = run(model, x, cache, options={"speculative": False})
    _close_to_eager(model, out, x)
    warned = [str(w.message) for w in caught]
    assert any("does not match its XXH3-128 hash" in m for m in warned), warned
    assert status(spec) == "miss"
    assert LocalStore(cache).verify().ok


def test_the_wait_for_the_index_lock_is_bounded(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "cache")
    store.put("ab" * 32, b"payload", {})
    with _held(tmp_path / "cache" / "index.lock"), pytest.raises(TimeoutError, match="held by"):
        store.put("cd" * 32, b"other", {})
    assert store.get("cd" * 32) == b"other"

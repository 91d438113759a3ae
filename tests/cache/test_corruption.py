"""Corrupt cache entries through plait.compile: a flipped byte, a truncated file, a missing file,
garbage in the index, an entry that no longer rebuilds into its program. Each is detected, never
used, rebuilt and reported; the answer is right and the cache verifies clean afterwards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from plait.cache import LocalStore
from plait.cache.artifact import pack, unpack
from plait.cache.lookup import CacheWarning
from plait.codegen import build
from plait.codegen.build import KernelCacheWarning
from tests.cache.helpers import artifact_entries, convnet, run, sample, status


def _entry(cache: Path) -> tuple[LocalStore, str]:
    store = LocalStore(cache)
    (entry,) = artifact_entries(store)
    return store, entry.key


def _flip(store: LocalStore, key: str) -> None:
    path = store.path(key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(store: LocalStore, key: str) -> None:
    path = store.path(key)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def _stale(store: LocalStore, key: str) -> None:
    """A well-formed entry (its own hash matches) whose saved plan no longer rebuilds into the
    recorded program."""
    doc, tensors = unpack(store.get(key) or b"")
    doc["plan"]["kernels"] = ["0" * 64, *doc["plan"]["kernels"]]
    (entry,) = [e for e in store.list() if e.key == key]
    store.put(key, pack(doc, tensors), entry.meta)


@pytest.mark.parametrize(
    ("damage", "reported"),
    [
        (_flip, "does not match its XXH3-128 hash"),
        (_truncate, "truncated"),
        (_stale, "differ from the recorded ones"),
    ],
    ids=["flipped-byte", "truncated", "stale-plan"],
)
def test_damaged_entry_is_rebuilt_and_reported(
    tmp_path: Path, damage: Callable[[LocalStore, str], None], reported: str
) -> None:
    cache = tmp_path / "cache"
    expected, _ = run(convnet(), sample(), cache)
    store, key = _entry(cache)
    damage(store, key)
    with pytest.warns(CacheWarning, match="discarded"):
        out, spec = run(convnet(), sample(), cache)
    assert torch.equal(out, expected)
    assert status(spec) == "miss"
    (event,) = spec.manifest.cache["events"]
    assert reported in event and "rebuilt" in event
    assert LocalStore(cache).verify().ok
    again, spec = run(convnet(), sample(), cache)
    assert status(spec) == "hit" and torch.equal(again, expected)


def test_missing_file_is_a_miss_and_rebuilt(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    expected, _ = run(convnet(), sample(), cache)
    store, key = _entry(cache)
    store.path(key).unlink()
    out, spec = run(convnet(), sample(), cache)
    assert status(spec) == "miss" and torch.equal(out, expected)
    assert LocalStore(cache).verify().ok
    assert status(run(convnet(), sample(), cache)[1]) == "hit"


def test_garbage_index_is_rebuilt_and_the_entry_still_serves(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    expected, _ = run(convnet(), sample(), cache)
    (cache / "index.json").write_bytes(b"\x00garbage{{{")
    with pytest.warns(CacheWarning, match="index.json unreadable"):
        out, spec = run(convnet(), sample(), cache)
    assert status(spec) == "hit" and torch.equal(out, expected)
    assert "rebuilt from the objects" in spec.manifest.cache["events"][0]
    report = LocalStore(cache).verify()
    assert report.ok, report  # NOTE: the run above rewrote a good index


def test_a_stale_entry_in_a_store_whose_index_cannot_be_locked_is_rebuilt(
    tmp_path: Path,
) -> None:
    """A stale entry is removed before it is rebuilt; where that removal fails (here a
    directory stands where the index lock file should be) the compile still answers, and the
    rebuilt entry replaces the stale one (removing it used to raise out of the call)."""
    cache = tmp_path / "cache"
    expected, _ = run(convnet(), sample(), cache)
    store, key = _entry(cache)
    _stale(store, key)
    (cache / "index.lock").unlink(missing_ok=True)
    (cache / "index.lock").mkdir()
    with pytest.warns(CacheWarning) as caught:
        out, spec = run(convnet(), sample(), cache)
    assert torch.equal(out, expected)
    assert status(spec) == "miss"
    warned = [str(w.message) for w in caught]
    assert any("differ from the recorded ones" in m for m in warned), warned
    assert any("index.lock" in m for m in warned), warned  # NOTE: the index was not updated
    (cache / "index.lock").rmdir()
    again, spec = run(convnet(), sample(), cache)
    assert status(spec) == "hit" and torch.equal(again, expected)


@pytest.mark.parametrize("speculative", [True, False], ids=["early-run", "after-capture"])
def test_a_damaged_kernel_library_behind_a_hit_is_in_its_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, speculative: bool
) -> None:
    """The kernel library a hit's program needs is damaged: it is discarded and rebuilt,
    warned, and the hit's manifest says so in ``cache.events`` (the load that rebuilt the
    program, ahead of capture for the early run or in the lookup, used to leave it out)."""
    kernels, cache = tmp_path / "kernels", tmp_path / "cache"
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(kernels))
    for name, fresh in (("_LOADED", {}), ("_DIRS", {}), ("_WARNED", set())):
        monkeypatch.setattr(build, name, fresh)
    options = {"speculative": speculative}
    expected, _ = run(convnet(), sample(), cache, options=options)
    (lib,) = sorted(kernels.glob("??/*.so"))
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0x01
    lib.unlink()  # NOTE: a new file: the library this process mapped is never written
    lib.write_bytes(bytes(data))
    monkeypatch.setattr(build, "_LOADED", {})  # NOTE: as a new process finds the cache
    with pytest.warns(KernelCacheWarning, match="does not match its recorded hash"):
        out, spec = run(convnet(), sample(), cache, options=options)
    assert status(spec) == "hit" and torch.equal(out, expected)
    events = spec.manifest.cache["events"]
    assert any(e.startswith("kernel cache: ") and "recorded hash" in e for e in events), events

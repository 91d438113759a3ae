"""The local store: atomic, self-verifying entries; corruption of every kind detected and removed;
an index that is rebuilt when it is garbage; least-recently-used eviction under a size limit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from plait.cache import CorruptEntryError, LocalStore, Store, resolve_store
from plait.cache.entry_file import ALIGN, FORMAT, HEADER, MAGIC, decode_entry, encode_entry
from tests.cache.helpers import store_clock

KEY = "ab" * 32
OTHER = "cd" * 32


def _store(tmp_path: Path, **kw: int) -> LocalStore:
    return LocalStore(tmp_path / "artifacts", **kw)


def test_round_trip_and_listing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.get(KEY) is None
    store.put(KEY, b"payload", {"parts": {"source": "s"}})
    assert store.get(KEY) == b"payload"
    (entry,) = store.list()
    assert entry.key == KEY and entry.meta["parts"] == {"source": "s"}
    assert store.stat().entries == 1 and store.verify().ok
    assert store.path(KEY) == tmp_path / "artifacts" / "objects" / "ab" / KEY
    assert not [p for p in store.path(KEY).parent.iterdir() if p.name.startswith(".")]


def test_the_store_is_an_interface() -> None:
    assert isinstance(resolve_store(True), Store)
    abstract = {"get", "put", "delete", "list", "stat", "verify"}
    assert abstract <= set(Store.__abstractmethods__)


def test_keys_are_hex_digests(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a cache key"):
        _store(tmp_path).path("../../etc/passwd")


def _corrupt_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


def _corrupt_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def _corrupt_header(path: Path) -> None:
    path.write_bytes(b"garbage" + path.read_bytes()[7:])


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_flip, "does not match its XXH3-128 hash"),
        (_corrupt_truncate, "truncated"),
        (_corrupt_header, "not a plait cache entry"),
    ],
    ids=["flipped-byte", "truncated", "bad-header"],
)
def test_corrupt_entry_is_detected_and_removed(tmp_path: Path, corrupt, message: str) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"x" * 1000, {})
    corrupt(store.path(KEY))
    with pytest.raises(CorruptEntryError, match=message):
        store.get(KEY)
    assert not store.path(KEY).exists() and store.get(KEY) is None
    assert store.stat().entries == 0


def test_verify_reports_and_removes_corrupt_entries(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"x" * 100, {})
    store.put(OTHER, b"y" * 100, {})
    _corrupt_flip(store.path(KEY))
    report = store.verify()
    assert not report.ok and report.checked == 2
    assert any("does not match" in p for p in report.problems)
    assert store.verify().ok and [e.key for e in store.list()] == [OTHER]


def test_missing_file_is_a_miss_and_verify_repairs_the_index(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"x", {})
    store.path(KEY).unlink()
    assert store.get(KEY) is None
    report = store.verify()
    assert any("has no object" in p for p in report.problems)
    assert store.verify().ok and store.stat().entries == 0


@pytest.mark.parametrize("garbage", [b"\x00\xff not json", b'{"schema": "other"}', b"[1, 2]"])
def test_garbage_index_is_rebuilt_from_the_objects(tmp_path: Path, garbage: bytes) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"payload", {"parts": {"source": "s"}})
    (tmp_path / "artifacts" / "index.json").write_bytes(garbage)
    fresh = _store(tmp_path)
    assert fresh.get(KEY) == b"payload"
    assert fresh.list()[0].meta["parts"] == {"source": "s"}
    assert any("rebuilt" in p for p in fresh.problems)
    report = fresh.verify()
    assert any("index.json unreadable" in p for p in report.problems)
    assert fresh.verify().ok


def test_lru_eviction_keeps_the_total_under_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_clock(monkeypatch)
    store = _store(tmp_path, max_bytes=2500)
    keys = [f"{i:02x}" * 32 for i in range(3)]
    for k in keys:
        store.put(k, b"z" * 1000, {})
    assert [e.key for e in store.list()] == [keys[2], keys[1]]  # the oldest went
    assert store.get(keys[1]) is not None  # now the most recently used
    store.put(keys[0], b"z" * 1000, {})
    assert {e.key for e in store.list()} == {keys[0], keys[1]}
    assert not store.path(keys[2]).exists()
    assert store.stat().bytes <= 2500


def test_size_limit_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLAIT_CACHE_MAX_BYTES", "1234")
    assert _store(tmp_path).max_bytes == 1234


def test_clear_and_delete(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"1", {})
    store.put(OTHER, b"2", {})
    assert store.delete(KEY) and not store.delete(KEY)
    assert store.clear() == 1 and store.stat().entries == 0


def test_entry_format_is_self_verifying() -> None:
    data = b"".join(encode_entry(b"payload", {"a": 1}))
    meta, payload = decode_entry(data)
    assert meta == {"a": 1} and bytes(payload) == b"payload"
    for bad in (data[:10], data[:-1], data[:-1] + b"X"):
        with pytest.raises(ValueError):
            decode_entry(bad)


def test_publish_is_atomic_under_a_failed_write(tmp_path: Path, monkeypatch) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"old", {})

    def broken(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="disk full"):
        store.put(KEY, b"new", {})
    monkeypatch.undo()
    assert store.get(KEY) == b"old"
    assert not [p for p in store.path(KEY).parent.iterdir() if p.name.startswith(".")]


def test_index_keeps_small_meta_and_entries_keep_all(tmp_path: Path) -> None:
    store = _store(tmp_path)
    parts = {"guards": ["x" * 100] * 50, "source": "s"}
    store.put(KEY, b"payload", {"parts": parts, "executor": "stax"})
    (entry,) = store.list()
    assert entry.meta == {"executor": "stax"}  # NOTE: the index stays small
    assert store.read_meta(KEY) == {"parts": parts, "executor": "stax"}
    assert store.read_meta(OTHER) is None
    index = (tmp_path / "artifacts" / "index.json").stat().st_size
    assert index < 1000


def test_an_entry_of_format_1_is_discarded_never_read(tmp_path: Path) -> None:
    """Format 1 (SHA-256 self-hash, unaligned payload) written by an earlier plait: refused like
    a corrupt entry (removed, reported), so the caller rebuilds it."""
    import hashlib
    import json
    import struct

    store = _store(tmp_path)
    meta = json.dumps({"parts": {}}).encode()
    payload = b"old payload"
    digest = hashlib.sha256(meta + payload).digest()
    old = struct.pack(">8sH32sQQ", b"PLAITART", 1, digest, len(meta), len(payload))
    path = store.path(KEY)
    path.parent.mkdir(parents=True)
    path.write_bytes(old + meta + payload)
    assert store.read_meta(KEY) is None
    with pytest.raises(CorruptEntryError, match="format 1"):
        store.get(KEY)
    assert not path.exists() and store.get(KEY) is None


def test_get_buffer_is_a_private_aligned_view_of_the_entry(tmp_path: Path) -> None:
    import torch

    store = _store(tmp_path)
    for n in range(3):  # NOTE: metas of several lengths: the payload is always aligned
        key = f"{n:02x}" * 32
        store.put(key, b"0123456789" * 10, {"parts": {"n": "x" * n * 7}})
        view = store.get_buffer(key)
        assert view is not None and not view.readonly and bytes(view) == b"0123456789" * 10
        assert torch.frombuffer(view, dtype=torch.uint8).data_ptr() % 64 == 0
        view[:4] = b"XXXX"  # NOTE: copy-on-write: never reaches the file
        assert store.get(key) == b"0123456789" * 10 and store.verify().ok


def test_a_mapped_entry_does_not_change_when_it_is_replaced_or_removed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"first" * 100, {})
    view = store.get_buffer(KEY)
    assert view is not None
    store.put(KEY, b"other" * 100, {})
    assert bytes(view) == b"first" * 100 and store.get(KEY) == b"other" * 100
    store.delete(KEY)
    assert bytes(view) == b"first" * 100


def test_the_default_get_buffer_is_a_writable_copy(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"payload", {})
    view = Store.get_buffer(store, KEY)
    assert view is not None and not view.readonly and bytes(view) == b"payload"
    assert Store.get_buffer(store, OTHER) is None


@pytest.mark.parametrize(
    "row",
    [
        {"size": 7, "last_access": "yesterday"},
        {"size": 7, "last_access": None},
        {"size": "7", "last_access": 1.0},
        {"size": 7, "last_access": 1.0, "meta": "not a dict"},
    ],
    ids=["last-access-text", "last-access-null", "size-text", "meta-text"],
)
def test_an_index_of_json_with_malformed_rows_is_rebuilt(
    tmp_path: Path, row: dict[str, object]
) -> None:
    """An index that parses, under the right schema, but whose rows are not the store's (a
    damaged or foreign file) is rebuilt from the objects: writing, listing and evicting never
    reach a row's bad value (a text last access used to raise TypeError from ``put``)."""
    store = _store(tmp_path)
    store.put(KEY, b"payload", {"parts": {"source": "s"}})
    index = tmp_path / "artifacts" / "index.json"
    doc = json.loads(index.read_bytes())
    doc["entries"][KEY] = row
    index.write_text(json.dumps(doc))
    fresh = _store(tmp_path, max_bytes=1)
    fresh.put(OTHER, b"other", {"parts": {"source": "t"}})  # NOTE: evicts KEY
    assert [e.key for e in fresh.list()] == [OTHER]
    assert any("index.json unreadable" in p for p in fresh.verify().problems)
    assert fresh.verify().ok


def test_an_index_row_under_a_name_that_is_no_key_is_rebuilt(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(KEY, b"payload", {"parts": {"source": "s"}})
    index = tmp_path / "artifacts" / "index.json"
    doc = json.loads(index.read_bytes())
    doc["entries"]["../../elsewhere"] = {"size": 1, "last_access": 0.0}
    index.write_text(json.dumps(doc))
    fresh = _store(tmp_path, max_bytes=1)
    fresh.put(OTHER, b"other", {"parts": {"source": "t"}})
    assert [e.key for e in fresh.list()] == [OTHER]


def test_an_object_whose_meta_is_no_json_object_is_not_listed(tmp_path: Path) -> None:
    """An object with a well-formed header whose meta parses as JSON but not as an object: the
    listing skips it (it used to raise TypeError from reading its head); verify removes it."""
    store = _store(tmp_path)
    store.put(KEY, b"payload", {"parts": {"source": "s"}})
    meta = b"[1]"
    pad = bytes(-(-(HEADER.size + len(meta)) // ALIGN) * ALIGN - HEADER.size - len(meta))
    head = HEADER.pack(MAGIC, FORMAT, bytes(16), len(meta), 0)
    path = store.path(OTHER)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_bytes(head + meta + pad)
    assert [e.key for e in store.list()] == [KEY]
    report = store.verify()
    assert not report.ok and not path.exists()

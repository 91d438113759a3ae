"""Adversarial tests of the warm-start formats: prepacked weights in entries, the
chunked XXH3 hash, store format 4 (reads mark mtimes instead of rewriting the index), the IR
text fast path, the TensorType fast path and the remembered probes.

Three tests here failed before their fixes (the hash pool in a forked child; an entry missing
from the index never counted nor evicted); everything else is a guarantee that was attacked and
held."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from torch import nn

import plait
import plait.conformance
from plait.cache import LocalStore
from plait.cache.artifact import ARENA, unpack
from plait.cache.compiled import load_compiled
from plait.codegen import build
from plait.ir import from_text
from plait.ir.chunked_hash import CHUNK, stream_digest
from plait.ir.identity import weights_hash
from plait.ir.types import TensorType
from plait.runtime.program_doc import PACKED
from tests.cache.helpers import call_program, status, stax_entry, store_clock
from tests.util import contract_tol, graph_structure, needs_bf16, needs_packs

ROOT = Path(__file__).resolve().parents[2]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _check(model: nn.Module, compiled: Any, make: Any) -> None:
    """``compiled`` against eager ``model`` on fresh draws, under the numerical contract."""
    with torch.no_grad():
        report = plait.conformance.check(
            model, compiled, make, candidate_module=model, op_class="model", draws=2
        )
    assert report.ok, str(report)


# --- chunked XXH3: the digest is a function of the bytes alone -----------------------------------


def _reference_digest(data: bytes) -> bytes:
    """The documented construction, written out: XXH3-128 over the length and the digests of
    the CHUNK-byte chunks (one chunk, possibly empty, for a short stream)."""
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    top = xxhash.xxh3_128()
    top.update(len(data).to_bytes(8, "little"))
    for c in chunks:
        top.update(xxhash.xxh3_128(c).digest())
    return top.digest()


@pytest.mark.parametrize(
    "size",
    [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 7],
    ids=["empty", "one", "chunk-1", "chunk", "chunk+1", "two-chunks", "two-chunks+7"],
)
def test_chunked_digest_is_the_documented_function_of_the_bytes(size: int) -> None:
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=_gen(size)).numpy()
    raw = data.tobytes()
    expected = _reference_digest(raw)
    assert stream_digest([raw]) == expected
    # NOTE: any split, including empty buffers and a split exactly at the chunk boundary
    cuts = sorted({0, size, size // 3, min(size, CHUNK), max(0, size - 1)})
    pieces = [raw[a:b] for a, b in itertools.pairwise(cuts)]
    assert stream_digest([b"", *pieces, b""]) == expected
    assert stream_digest([memoryview(data)]) == expected
    if size:
        flipped = bytearray(raw)
        flipped[-1] ^= 1
        assert stream_digest([bytes(flipped)]) != expected
        # NOTE: the length is hashed: a trailing zero byte is another stream
        assert stream_digest([raw, b"\0"]) != expected


def test_chunked_digest_of_many_tiny_buffers() -> None:
    raw = torch.randint(0, 256, (CHUNK + 4099,), dtype=torch.uint8, generator=_gen(9))
    raw_bytes = raw.numpy().tobytes()
    step = 4099
    tiny = [raw_bytes[i : i + step] for i in range(0, len(raw_bytes), step)]
    assert stream_digest(tiny) == _reference_digest(raw_bytes) == stream_digest([raw_bytes])


FORK_CHILD = """
import os, signal, sys
from plait.ir.chunked_hash import CHUNK, stream_digest
data = os.urandom(3 * CHUNK)
expected = stream_digest([data])  # NOTE: the pool now exists, its threads idle
pid = os.fork()
if pid == 0:
    signal.alarm(int(sys.argv[1]))  # NOTE: a hang ends the child by SIGALRM
    os._exit(0 if stream_digest([data]) == expected else 3)
_, st = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(st))
"""


def test_chunked_digest_works_in_a_forked_child() -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORK_CHILD, "3"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", f"child exit {out.stdout.split()[-1]} (-14: hung)"


FORK_COMPILE = """
import os, signal, sys
import torch
from torch import nn
import plait
import plait.contract
torch.set_num_threads(1)
cache, seconds = sys.argv[1], int(sys.argv[2])

def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(1100, 1100), nn.ReLU()).eval()  # NOTE: 4.8 MB: two chunks

x = torch.randn(3, 1100)
with torch.no_grad():
    plait.compile(model(0), options={"cache": cache})(x)
pid = os.fork()
if pid == 0:
    signal.alarm(seconds)
    m = model(1)
    with torch.no_grad():
        y = plait.compile(m, options={"cache": cache})(x)
        tol = plait.contract.load().tolerance("model", torch.float32)
        ok = torch.allclose(y, m(x), rtol=tol.rtol, atol=tol.atol)
    os._exit(0 if ok else 3)
_, st = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(st))
"""


@pytest.mark.slow
def test_a_forked_child_can_compile(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", FORK_COMPILE, str(tmp_path / "cache"), "20"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0", f"child exit {out.stdout.split()[-1]} (-14: hung)"


def test_weights_hash_sees_a_change_past_the_first_chunk() -> None:
    w = torch.randn(1100, 1100, generator=_gen(3))  # NOTE: 4.8 MB: the last element is chunk 2
    base = weights_hash({"w": w, "b": torch.randn(5, generator=_gen(4))})
    for index in (-1, CHUNK // 4 - 20, CHUNK // 4 + 20):
        changed = w.clone()
        changed.view(-1)[index] += 1.0
        assert weights_hash({"w": changed, "b": torch.randn(5, generator=_gen(4))}) != base
    # NOTE: non-contiguous and shared storages hash by value
    assert weights_hash({"w": w.t().contiguous().t(), "b": torch.randn(5, generator=_gen(4))}) == (
        base
    )


# --- the store: reads mark mtimes, the index orders by them -------------------------------------


def _payload(n: int, seed: int) -> bytes:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=_gen(seed)).numpy().tobytes()


def _on_disk(store: LocalStore) -> int:
    return sum(p.stat().st_size for p in store.objects.rglob("*") if p.is_file())


def _drop_from_index(store: LocalStore, key: str) -> None:
    """What a process killed between publishing an object and recording it leaves."""
    path = store.root / "index.json"
    data = json.loads(path.read_text())
    data["entries"].pop(key)
    path.write_text(json.dumps(data))


def test_lru_order_follows_reads_that_only_touch_mtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_clock(monkeypatch)
    store = LocalStore(tmp_path / "a", max_bytes=3500)
    keys = [f"{i:02x}" * 32 for i in range(3)]
    payloads = {k: _payload(1000, i) for i, k in enumerate(keys)}
    for k in keys:
        store.put(k, payloads[k], {})
    index_before = (store.root / "index.json").read_bytes()
    # NOTE: reads by other store objects (other processes) in reverse order of writing
    for k in reversed(keys):
        assert LocalStore(tmp_path / "a").get(k) == payloads[k]
    assert (store.root / "index.json").read_bytes() == index_before  # NOTE: no index rewrite
    assert [e.key for e in store.list()] == keys  # NOTE: most recently read first
    new = "ff" * 32
    store.put(new, _payload(1000, 7), {})
    # NOTE: the least recently *read* (keys[2], the newest written) went
    assert {e.key for e in store.list()} == {new, keys[0], keys[1]}
    assert not store.path(keys[2]).exists()
    assert _on_disk(store) <= store.max_bytes


def test_an_entry_missing_from_the_index_still_counts_toward_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_clock(monkeypatch)
    store = LocalStore(tmp_path / "a", max_bytes=2500)
    orphan = "0a" * 32
    payload = _payload(1000, 1)
    store.put(orphan, payload, {})
    _drop_from_index(store, orphan)
    fresh = LocalStore(tmp_path / "a", max_bytes=2500)
    assert fresh.get(orphan) == payload  # NOTE: it is used: a hit
    for i in range(3):
        fresh.put(f"{i + 0x10:02x}" * 32, _payload(1000, 10 + i), {})
    assert _on_disk(fresh) <= fresh.max_bytes, (
        f"{_on_disk(fresh)} bytes on disk under a limit of {fresh.max_bytes}; "
        f"stat says {fresh.stat().bytes}"
    )


def test_a_corrupt_index_is_found_by_a_read(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "a")
    key = "ab" * 32
    payload = _payload(500, 2)
    store.put(key, payload, {"parts": {"source": "s"}})
    (store.root / "index.json").write_bytes(b"\x00 not json")
    fresh = LocalStore(tmp_path / "a")
    assert fresh.get(key) == payload
    assert any("rebuilt" in p for p in fresh.problems)
    assert json.loads((store.root / "index.json").read_text())["entries"][key]["size"] > 500


def test_a_byte_flipped_past_the_first_chunk_is_detected(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "a")
    key = "cd" * 32
    payload = _payload(2 * CHUNK + 100, 5)
    store.put(key, [payload[:10], payload[10:]], {})
    path = store.path(key)
    for offset in (-1, -(CHUNK + 50)):
        store.put(key, [payload[:10], payload[10:]], {})
        data = bytearray(path.read_bytes())
        data[offset] ^= 0x10
        path.write_bytes(bytes(data))
        with pytest.raises(plait.cache.CorruptEntryError, match="does not match"):
            store.get(key)
        assert not path.exists()


# --- IR text: the fast path agrees with the general one ------------------------------------------


def _parse(text: str, general: bool) -> tuple[object, ...]:
    from plait.ir import parser as text_mod

    with pytest.MonkeyPatch.context() as m:
        if general:
            never = re.compile(r"(?!)")
            m.setattr(text_mod, "_FAST_STMT_RE", never)
            m.setattr(text_mod, "_FAST_INPUT_RE", never)
        try:
            return ("ok", graph_structure(from_text(text, verify=False)))
        except Exception as exc:  # NOTE: the error (type, message with line/column) must agree
            return ("error", type(exc).__name__, str(exc))


INPUT_LINES = [
    "user %x: f32[2, 3]",
    "user %x.y: f32[2, 3]@cpu",
    "user %x: f32[2,3]",
    "user %x:f32[2, 3]",
    "user %x: f32[02, 3]   ",
    "user %x: f32[2, 3]\r",
    "user %x: f32[2, 3]@cuda:0",
    "bogus %x: f32[2, 3]",
]
STATEMENTS = [
    "%0 = add(%x, 1e-05) : f32[2, 3]",
    "%0 = add(%x, -1) : f32[2, 3]",
    "%0 = add(%x, -inf) : f32[2, 3]",
    "%0 = add(%x, -nan) : f32[2, 3]",
    "%0 = add(%x, 1.) : f32[2, 3]",
    "%0 = add(%x, 1E5) : f32[2, 3]",
    "%0 = add(%x, 1_0) : f32[2, 3]",
    "%0 = add(%x, none) : f32[2, 3]",
    "%0 = add(%x, true) : f32[2, 3]",
    "%0 = add(%x, bool) : f32[2, 3]",
    "%0 = add(%x,1) : f32[2, 3]",
    "%0 = add(%x, 1 ) : f32[2, 3]",
    "%a.b = add(%x, %x) : f32[2, 3]",
    "%x = add(%x, 1) : f32[2, 3]",
    "%0 = add(%y, 1) : f32[2, 3]",
    "%0 = sum(%x) {dims=[1], keepdim=true, } : f32[2, 1]",
    "%0 = sum(%x) {dims=[1], dims=[0]} : f32[2]",
    "%0 = sum(%x) {} : f32[2]",
    "%0 = sum(%x) {dims=[]} : f32[]",
    "%0 = sum(%x) {dims=[1, ]} : f32[2]",
    "%0 = sum(%x) {dims=[true]} : f32[2]",
    "%0 = sum(%x) {dims=1} : f32[2]",
    "%0 = sum(%x) {dims=[1]}: f32[2]",
    "%0 = clamp(%x) {min=-inf, max=1e-05} : f32[2, 3]",
    "%0 = clamp(%x) {min=none} : f32[2, 3]",
    "%0 = clamp(%x) {bogus=1} : f32[2, 3]",
    "%0 = softmax(%x) {dim=-0} : f32[2, 3]",
    "%0 = softmax(%x) {dim=1.0} : f32[2, 3]",
    "%0 = to(%x) {dtype=bf16} : bf16[2, 3]",
    "%0 = nosuchop(%x) : f32[2, 3]",
    "%0 = add(%x, 1) : f32[2, 3], f32[2]",
    "%0 = add(%x, 1) : f32[-2, 3]",
    "%0 = add(%x, 1) : f32[2, 3]@@cpu",
    "%0 = add(%x, 1) : f32",
    "%0 = add(%x, 1) : f32[2, 3]\t",
]


@pytest.mark.parametrize("statement", STATEMENTS)
def test_fast_and_general_parsers_agree_on_unusual_text(statement: str) -> None:
    for line in INPUT_LINES:
        text = f"graph(\n  {line}\n) {{\n  {statement}\n  return %0\n}}"
        assert _parse(text, general=False) == _parse(text, general=True), text


def test_a_parse_error_after_fast_statements_names_its_line_and_column() -> None:
    body = "\n".join(f"  %{i + 1} = add(%{i}, 1.5) : f32[4]" for i in range(40))
    text = (
        f"graph(\n  user %0: f32[4]\n) {{\n{body}\n  %41 = add(%40, @) : f32[4]\n  return %41\n}}"
    )
    fast = _parse(text, general=False)
    assert fast == _parse(text, general=True)
    assert fast[0] == "error" and "44" in str(fast[2]), fast


class _Int(int):
    pass


def test_tensor_type_fast_path_matches_normalizing() -> None:
    assert TensorType((2, 3), torch.float32) == TensorType([2, 3], torch.float32)
    assert TensorType(torch.Size([2, 3]), torch.float32).shape.__class__ is tuple
    t = TensorType((_Int(2), 3), torch.float32)
    assert t == TensorType((2, 3), torch.float32) and hash(t) == hash(
        TensorType((2, 3), torch.float32)
    )
    with pytest.raises(TypeError):
        TensorType((True, 3), torch.float32)
    with pytest.raises(ValueError, match="negative"):
        TensorType((2, -1), torch.float32)
    with pytest.raises(ValueError, match="negative"):
        TensorType((_Int(-1),), torch.float32)
    assert TensorType((2,), torch.float32, torch.device("cpu")).device == "cpu"
    assert TensorType((2,), torch.float32, "cuda").device == "cuda:0"


# --- remembered probes --------------------------------------------------------------------------


def test_a_remembered_probe_for_another_identity_or_unreadable_is_probed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    calls: list[int] = []

    def compute(v: int) -> Any:
        return lambda: calls.append(v) or {"v": v}

    assert build.remembered("probe", ["a", 1], compute(1)) == {"v": 1}
    assert build.remembered("probe", ["a", 1], compute(2)) == {"v": 1} and calls == [1]
    assert build.remembered("probe", ["a", 2], compute(3)) == {"v": 3} and calls == [1, 3]
    (tmp_path / "probe.json").write_text('{"identity": ["a", 2], "value": [1]}')
    assert build.remembered("probe", ["a", 2], compute(4)) == {"v": 4}
    (tmp_path / "probe.json").write_text("{truncated")
    assert build.remembered("probe", ["a", 2], compute(5)) == {"v": 5}
    assert calls == [1, 3, 4, 5]


def test_a_toolchain_memo_is_keyed_by_the_compiler_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    fake = tmp_path / "fakecxx"
    fake.write_text("#!/bin/sh\necho fake-compiler $$\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    build.toolchain.cache_clear()
    try:
        first = build.toolchain()
        assert first.cxx == str(fake) and first.version.startswith("fake-compiler")
        build.toolchain.cache_clear()
        assert build.toolchain().version == first.version  # NOTE: remembered, not re-run
        written = fake.stat().st_mtime_ns
        fake.write_text("#!/bin/sh\necho other-compiler\n")  # NOTE: another binary, same path
        os.utime(fake, ns=(written + 10**9,) * 2)  # NOTE: a second later, at any timer resolution
        build.toolchain.cache_clear()
        assert build.toolchain().version == "other-compiler"
    finally:
        build.toolchain.cache_clear()


# --- prepacked weights end to end ---------------------------------------------------------------


class TwoSizes(nn.Module):
    """One conv weight at two input sizes (two packs) and at one size twice, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv(self.bn(self.conv(x)).relu())
        b = self.conv(nn.functional.max_pool2d(x, 2))
        return self.fc(a.mean(dim=(2, 3)) + b.amax(dim=(2, 3)))


SHAPE = (2, 4, 12, 12)


def _model(dtype: torch.dtype = torch.float32, seed: int = 0) -> TwoSizes:
    torch.manual_seed(seed)
    model = TwoSizes().eval()
    with torch.no_grad():
        model.bn.running_mean.normal_(0, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model.to(dtype)


def _inputs(dtype: torch.dtype = torch.float32) -> Any:
    return lambda s: (torch.randn(SHAPE, generator=_gen(1000 + s)).to(dtype),)


def _compile(model: nn.Module, cache: Path) -> Any:
    return plait.compile(model, options={"cache": str(cache)})


def _untimed(model: nn.Module, cache: Path) -> Any:
    return plait.compile(model, options={"cache": str(cache), "stax": {"timed_matmul": False}})


@needs_packs
@pytest.mark.parametrize(
    "dtype",
    [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16",
                                                          marks=needs_bf16)],
)  # fmt: skip
def test_a_warm_start_with_a_shared_weight_matches_cold_and_eager(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    cache = tmp_path / "cache"
    xs = [_inputs(dtype)(s)[0] for s in range(3)]
    cold = _compile(_model(dtype), cache)
    with torch.no_grad():
        cold_out = [cold(x) for x in xs]
    assert status(cold.specializations[-1]) == "miss"
    store, key = stax_entry(cache)
    doc, _ = unpack(store.get(key) or b"")
    assert len(doc["plan"]["prepacked"]) >= 3, doc["plan"]["prepacked"]
    model = _model(dtype)
    warm = _compile(model, cache)
    with torch.no_grad():
        warm_out = [warm(x) for x in xs]
    spec = warm.specializations[-1]
    assert status(spec) == "hit"
    details = [t.detail for t in spec.compiled.program.evidence.nodes.values()]
    assert any("loaded from the cache entry" in d for d in details), details
    for a, b in zip(warm_out, cold_out):
        assert torch.equal(a, b)
    _check(model, warm, _inputs(dtype))


@needs_packs
def test_a_frozen_weight_changed_in_place_after_a_warm_start_is_not_served_stale(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    x0 = _inputs()(0)[0]
    with torch.no_grad():
        _compile(_model(), cache)(x0)
    model = _model()
    warm = _compile(model, cache)
    with torch.no_grad():
        warm(x0)
    assert status(warm.specializations[-1]) == "hit"
    with torch.no_grad():
        model.conv.weight.add_(torch.randn(model.conv.weight.shape, generator=_gen(77)))
        model.fc.weight.mul_(1.5)
    x1 = _inputs()(1)[0]
    with torch.no_grad():
        got = warm(x1)
    assert len(warm.specializations) == 2 and status(warm.specializations[-1]) == "miss"
    _check(model, warm, _inputs())
    with torch.no_grad():
        torch.testing.assert_close(got, model(x1), **contract_tol("model", torch.float32))
    # NOTE: the changed weights in another instance (a new process) hit the new entry
    again = _model()
    with torch.no_grad():
        again.load_state_dict(model.state_dict())
        out = _compile(again, cache)(x1)
    assert torch.equal(out, got)


@needs_packs
def test_prepacked_bytes_corrupted_in_the_entry_are_rebuilt_and_reported(tmp_path: Path) -> None:
    """The rebuild is a fresh compile, compared bit for bit with the first: no library chosen by
    timing (it may pick the other one the second time)."""
    cache = tmp_path / "cache"
    model = _model(seed=4)
    x = _inputs()(5)[0]
    with torch.no_grad():
        expected = _untimed(model, cache)(x)
    store, key = stax_entry(cache)
    data = store.get(key) or b""
    _, tensors = unpack(data)
    blob = next(v for k, v in tensors.items() if k.startswith(f"{PACKED}data:"))
    raw = bytes(blob.numpy())
    path = store.path(key)
    on_disk = bytearray(path.read_bytes())
    at = bytes(on_disk).find(raw)
    assert at > 0 and ARENA.encode() in on_disk[:at]
    on_disk[at + len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(on_disk))
    with pytest.warns(plait.cache.lookup.CacheWarning):
        compiled = _untimed(model, cache)
        with torch.no_grad():
            got = compiled(x)
    spec = compiled.specializations[-1]
    assert status(spec) == "miss"
    assert any("does not match" in e for e in spec.manifest.cache["events"])
    assert torch.equal(got, expected)
    saved = load_compiled(LocalStore(cache), key)
    assert saved is not None and torch.equal(call_program(saved.program, x), expected)


WARM_CHILD = """
import json, sys
import torch
sys.path.insert(0, sys.argv[2])
from tests.cache.test_warm_start_format_attacks import _inputs, _model
import plait
import plait.contract
tol = plait.contract.load().tolerance("model", torch.float32)
model = _model(seed=int(sys.argv[3]))
compiled = plait.compile(model, options={"cache": sys.argv[1]})
x = _inputs()(int(sys.argv[4]))[0]
with torch.no_grad():
    first = compiled(x)
    model.conv.weight.add_(0.25)  # NOTE: after a warm start in a new process
    second = compiled(x)
    eager = model(x)
specs = compiled.specializations
print(json.dumps({
    "status": [s.manifest.cache["status"] for s in specs],
    "first": first.flatten().tolist(),
    "second": second.flatten().tolist(),
    "close": bool(torch.allclose(second, eager, rtol=tol.rtol, atol=tol.atol)),
}))
"""


@pytest.mark.slow
@needs_packs
def test_in_place_change_after_a_warm_start_in_a_new_process(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    model = _model(seed=6)
    x = _inputs()(8)[0]
    with torch.no_grad():
        cold = _compile(model, cache)(x)
    # NOTE: the repository first, then whatever path the caller runs plait from
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WARM_CHILD), str(cache), str(ROOT), "6", "8"],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["status"] == ["hit", "miss"], result["status"]
    assert torch.equal(torch.tensor(result["first"]), cold.flatten())
    assert result["close"]
    with torch.no_grad():
        model.conv.weight.add_(0.25)
        assert not torch.equal(torch.tensor(result["second"]), cold.flatten())
        torch.testing.assert_close(
            torch.tensor(result["second"]).view_as(cold),
            model(x),
            **contract_tol("model", torch.float32),
        )


class _NoLock:
    """The lock of a store directory this process cannot write (index.lock cannot be opened)."""

    def __enter__(self) -> None:
        raise PermissionError(13, "Permission denied", "index.lock")

    def acquire(self, timeout: float = -1) -> None:
        raise PermissionError(13, "Permission denied", "index.lock")

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_read_only_store_serves_hits_and_compiles_misses_without_saving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Root ignores file modes, so the read-only directory is simulated: its lock cannot be
    taken, its objects' times cannot be set, nothing can be published in it."""
    import plait.cache.store as store_mod

    cache = tmp_path / "cache"
    x = _inputs()(3)[0]
    with torch.no_grad():
        expected = _compile(_model(seed=2), cache)(x)
    root = str(cache)
    real_utime, real_write = os.utime, store_mod.write_atomic

    def utime(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(root):
            raise PermissionError(1, "Operation not permitted", str(path))
        real_utime(path, *args, **kwargs)

    def write_atomic(path: Path, *args: Any, **kwargs: Any) -> None:
        if str(path).startswith(root):
            raise PermissionError(13, "Permission denied", str(path))
        real_write(path, *args, **kwargs)

    monkeypatch.setattr(os, "utime", utime)
    monkeypatch.setattr(store_mod, "write_atomic", write_atomic)
    before = sorted(p.name for p in cache.rglob("*"))
    store = LocalStore(cache)
    store._lock = _NoLock()  # type: ignore[assignment]
    warm = plait.compile(_model(seed=2), options={"cache": store})
    with torch.no_grad():
        got = warm(x)
    assert status(warm.specializations[-1]) == "hit" and torch.equal(got, expected)
    other = _model(seed=3)
    compiled = plait.compile(other, options={"cache": store})
    with pytest.warns(plait.cache.lookup.CacheWarning), torch.no_grad():
        compiled(x)
    spec = compiled.specializations[-1]
    assert status(spec) == "miss"
    assert any("could not save" in e for e in spec.manifest.cache["events"])
    _check(other, compiled, _inputs())
    assert sorted(p.name for p in cache.rglob("*")) == before


@needs_packs
def test_a_changed_bn_statistic_misses_although_only_the_folded_pack_depends_on_it(
    tmp_path: Path,
) -> None:
    """BN is folded into the conv whose weight is prepacked: a BN buffer changed (in place after
    a warm start, or in a fresh instance) must never be served the entry's folded pack."""
    cache = tmp_path / "cache"
    x = _inputs()(11)[0]
    with torch.no_grad():
        _compile(_model(seed=9), cache)(x)
    model = _model(seed=9)
    warm = _compile(model, cache)
    with torch.no_grad():
        warm(x)
        assert status(warm.specializations[-1]) == "hit"
        model.bn.running_var.mul_(torch.rand(4, generator=_gen(5)) + 0.5)
        warm(x)
    assert status(warm.specializations[-1]) == "miss"
    _check(model, warm, _inputs())
    fresh = _model(seed=9)
    with torch.no_grad():
        fresh.bn.running_mean.add_(torch.randn(4, generator=_gen(6)))
    compiled = _compile(fresh, cache)
    with torch.no_grad():
        compiled(x)
    assert status(compiled.specializations[-1]) == "miss"
    _check(fresh, compiled, _inputs())

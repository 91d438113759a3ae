"""Cache entries that carry oneDNN's prepacked weights: the artifact stores them as aligned blobs
(an ordinary safetensors file all the same), a cold compile prepacks each constant weight once,
a warm start imports every one of them and reorders nothing (its outputs are the cold program's,
bit for bit), a saved pack that cannot be imported is reordered instead and said so, and an entry
that lists a pack without its bytes is discarded and rebuilt."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from torch import nn

import plait
import plait.conformance
from plait.cache import LocalStore
from plait.cache.artifact import ALIGN, ARENA, pack, pack_pieces, unpack
from plait.cache.compiled import StaleEntryError, load_compiled
from plait.cache.lookup import CacheWarning
from plait.codegen import packed
from plait.codegen.extern import PreparedWeight
from plait.codegen.plan import ExternStep
from plait.runtime.program_doc import PACKED
from tests.cache.held_check import held_checks
from tests.cache.helpers import call_program, status, stax_entry
from tests.util import needs_bf16, needs_packs

ROOT = Path(__file__).resolve().parents[2]
LOADED = "its bytes loaded from the cache entry"
UNUSABLE = "the entry's bytes were unusable: "
SHAPE = (2, 3, 16, 16)

BF16 = pytest.param(torch.bfloat16, marks=needs_bf16, id="bf16")
DTYPES = [pytest.param(torch.float32, id="fp32"), BF16]


# NOTE: the compile options of every test here: float32 linears run oneDNN (with prepacked
# weights an entry carries), as bfloat16 ones and builds without MKL always do; MKL's packed
# linears, never in an entry, are tests/cache/test_mkl_packed_linear.py's; the depthwise conv
# runs oneDNN too, and so do the 1x1 and stem convs (plait's native convolution kernels keep no
# pack in an entry: tests/codegen/test_depthwise_conv.py, test_pointwise_native.py,
# test_stem_conv.py).
ONEDNN_LINEARS = {
    "stax": {"mkl_linear": False, "depthwise": False, "pointwise": False, "stem": False}
}


class Net(nn.Module):
    """Every kind of prepacked weight: a 7x7 stride-2 stem (BN folded into it), a 1x1 conv with
    a fused residual add, a grouped 3x3 with a fused relu, a depthwise 3x3, two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 7, stride=2, padding=3)
        self.bn = nn.BatchNorm2d(16)
        self.pw = nn.Conv2d(16, 16, 1, bias=False)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.stem(x)).relu()
        y = self.pw(y) + y
        y = self.grouped(y).relu()
        y = self.dw(y).mean(dim=(2, 3))
        return self.fc2(self.fc1(y).relu())


class Shared(nn.Module):
    """One conv weight used at two input sizes (two layouts: two packs) and twice at one size
    (one pack, read by two calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv(self.conv(x).relu())
        b = self.conv(nn.functional.avg_pool2d(x, 2))
        return a.mean(dim=(2, 3)) + b.amax(dim=(2, 3))


def net(dtype: torch.dtype = torch.float32, seed: int = 0) -> Net:
    torch.manual_seed(seed)
    model = Net().eval().to(dtype)
    with torch.no_grad():  # NOTE: BN statistics that are not the identity
        model.bn.running_mean.normal_(0, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def inputs(seeds: range, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(SHAPE, generator=torch.Generator().manual_seed(s)).to(dtype) for s in seeds]


def _cold(model: nn.Module, cache: Path, xs: list[torch.Tensor]) -> tuple[list[torch.Tensor], Any]:
    compiled = plait.compile(model, options={"cache": str(cache), **ONEDNN_LINEARS})
    with torch.no_grad():
        outs = [compiled(x) for x in xs]
    spec = compiled.specializations[-1]
    assert status(spec) == "miss" and spec.compiled.program is not None
    return outs, spec.compiled.program


def _onednn_details(program: Any) -> list[str]:
    return [t.detail for t in program.evidence.nodes.values() if t.detail.startswith("oneDNN")]


def _const_weight_steps(program: Any) -> list[ExternStep]:
    """The oneDNN steps whose weight is a constant of the graph."""
    consts = {v.name for v in program.graph.inputs if v.kind == "const"}
    return [
        s
        for s in program.plan.steps
        if isinstance(s, ExternStep)
        and s.call.detail.startswith("oneDNN")
        and s.node.inputs[1].name in consts
    ]


def _refuse_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    def prepare(self: PreparedWeight, w: torch.Tensor) -> None:
        raise AssertionError("a prepacked weight was reordered again")

    monkeypatch.setattr(PreparedWeight, "prepare", prepare)


def _refuse_read(self: PreparedWeight, w: torch.Tensor) -> None:
    if self.track_finite:
        raise AssertionError("a weight's finiteness was read again")


def _count_prepare(monkeypatch: pytest.MonkeyPatch) -> list[tuple[PreparedWeight, torch.Tensor]]:
    calls: list[tuple[PreparedWeight, torch.Tensor]] = []
    real = PreparedWeight.prepare

    def prepare(self: PreparedWeight, w: torch.Tensor) -> None:
        calls.append((self, w))
        real(self, w)

    monkeypatch.setattr(PreparedWeight, "prepare", prepare)
    return calls


def _rewrite(store: LocalStore, key: str, edit: Callable[..., None]) -> None:
    """Rewrite the entry under ``key`` (a well-formed entry: its own hash matches) after
    ``edit(doc, tensors, blobs)``."""
    doc, found = unpack(store.get(key) or b"")
    blobs = {k: v.clone() for k, v in found.items() if k.startswith(PACKED)}
    tensors = {k: v.clone() for k, v in found.items() if not k.startswith(PACKED)}
    edit(doc, tensors, blobs)
    (entry,) = [e for e in store.list() if e.key == key]
    store.put(key, pack_pieces(doc, tensors, blobs), entry.meta)


def _entry_and_a_conv_pack(
    cache: Path, xs: list[torch.Tensor]
) -> tuple[list[torch.Tensor], LocalStore, str, str]:
    """A cold compile of ``net()`` into ``cache`` (its outputs on ``xs``), its Stax entry, and
    the key of one convolution weight's saved pack."""
    expected, _ = _cold(net(), cache, xs)
    store, key = stax_entry(cache)
    doc, _ = unpack(store.get(key) or b"")
    conv = min(k for k in doc["plan"]["prepacked"] if ":conv2d:" in k)
    return expected, store, key, conv


# --- the artifact: blobs ------------------------------------------------------------------------


def _blobs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = {"one": 1, "odd": 63, "exact": 64, "over": 65, "big": 1000, "none": 0}
    return {
        k: torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for k, n in sizes.items()
    }


def _plain(seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(3, 5, generator=g),
        "d": torch.randn(3, generator=g).double(),
        "h": torch.randn(7, generator=g).to(torch.bfloat16),
        "i": torch.randint(-100, 100, (5,), dtype=torch.int32, generator=g),
        "u": torch.randint(0, 256, (3,), dtype=torch.uint8, generator=g),
        "b": torch.randn(4, generator=g) > 0,
    }


def _aligned_copy(data: bytes, offset: int = 0) -> tuple[memoryview, torch.Tensor]:
    """``data`` in writable memory that starts ``offset`` bytes past a multiple of ALIGN."""
    room = torch.empty(len(data) + 2 * ALIGN, dtype=torch.uint8)
    start = (-room.data_ptr() % ALIGN) + offset
    region = room[start : start + len(data)]
    region.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    assert region.data_ptr() % ALIGN == offset
    return memoryview(region.numpy()).cast("B"), region


def _within(t: torch.Tensor, region: torch.Tensor) -> bool:
    return region.data_ptr() <= t.data_ptr() < region.data_ptr() + region.numel()


def _check_blobs(out: dict[str, torch.Tensor], blobs: dict[str, torch.Tensor]) -> None:
    for name, b in blobs.items():
        assert out[name].dtype == torch.uint8 and torch.equal(out[name], b), name
        if b.numel():
            assert out[name].data_ptr() % ALIGN == 0, name


def test_blobs_come_back_aligned_and_in_place_from_an_aligned_buffer() -> None:
    blobs, plain = _blobs(), _plain()
    buf, region = _aligned_copy(pack({"graph": "g"}, plain, blobs))
    doc, out = unpack(buf)
    assert doc == {"graph": "g"} and set(out) == set(blobs) | set(plain)
    _check_blobs(out, blobs)
    for name, b in blobs.items():
        if b.numel():
            assert _within(out[name], region), f"blob {name} was copied"
    for name, t in plain.items():
        assert out[name].dtype == t.dtype and torch.equal(out[name], t), name


@pytest.mark.parametrize("offset", [8, 16, 32])
def test_blobs_of_a_misaligned_buffer_are_copied_aligned(offset: int) -> None:
    blobs, plain = _blobs(seed=offset), _plain(seed=offset)
    buf, region = _aligned_copy(pack({}, plain, blobs), offset)
    _, out = unpack(buf)
    _check_blobs(out, blobs)
    assert not any(_within(out[n], region) for n, b in blobs.items() if b.numel())
    for name, t in plain.items():
        assert torch.equal(out[name], t), name


def test_blobs_of_read_only_bytes_are_aligned() -> None:
    blobs = _blobs(seed=4)
    _, out = unpack(pack({}, _plain(), blobs))
    _check_blobs(out, blobs)


def test_a_store_entry_holds_blobs_aligned_and_is_read_in_place(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "artifacts")
    blobs, plain = _blobs(seed=5), _plain(seed=5)
    store.put("ab" * 32, pack_pieces({"n": 1}, plain, blobs), {"parts": {}})
    buf = store.get_buffer("ab" * 32)
    assert buf is not None
    region = torch.frombuffer(buf, dtype=torch.uint8)
    doc, out = unpack(buf)
    assert doc == {"n": 1}
    _check_blobs(out, blobs)
    assert all(_within(out[n], region) for n, b in blobs.items() if b.numel())
    assert all(torch.equal(out[n], t) for n, t in plain.items())


def test_the_data_section_starts_aligned_whatever_the_header() -> None:
    for n in range(0, 130, 7):
        data = pack({"graph": "x" * n}, _plain(), _blobs())
        header = int.from_bytes(data[:8], "little")
        assert (8 + header) % ALIGN == 0, n
        assert data[8 + header - 1 : 8 + header] in (b" ", b"}")
        # NOTE: every tensor starts at a multiple of its element size
        spec = json.loads(data[8 : 8 + header])
        for name, info in spec.items():
            if name != "__metadata__":
                size = {"F64": 8, "F32": 4, "I32": 4, "BF16": 2, "U64": 8}.get(info["dtype"], 1)
                assert info["data_offsets"][0] % size == 0, name


def test_safetensors_reads_the_plain_tensors_and_the_arena() -> None:
    blobs, plain = _blobs(seed=6), _plain(seed=6)
    data = pack({"graph": "g"}, plain, blobs)
    loaded = safetensors.torch.load(data)
    assert set(loaded) == set(plain) | {ARENA}
    for name, t in plain.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name
    arena = loaded[ARENA].view(torch.uint8)
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    index = json.loads(header["__metadata__"]["arena"])
    assert set(index) == set(blobs)
    for name, (begin, end) in index.items():
        assert begin % ALIGN == 0 and torch.equal(arena[begin:end], blobs[name]), name


def test_pieces_are_the_tensors_own_memory() -> None:
    w = torch.randn(8, generator=torch.Generator().manual_seed(7))
    blob = torch.randint(0, 256, (100,), dtype=torch.uint8, generator=torch.Generator())
    pieces = pack_pieces({}, {"w": w}, {"blob": blob})
    w.mul_(3)
    blob.add_(1)
    _, out = unpack(b"".join(bytes(p) for p in pieces))
    assert torch.equal(out["w"], w) and torch.equal(out["blob"], blob)


@pytest.mark.parametrize(
    ("tensors", "blobs"),
    [
        ({"x": torch.ones(2)}, {"x": torch.ones(4, dtype=torch.uint8)}),
        ({}, {ARENA: torch.ones(4, dtype=torch.uint8)}),
    ],
    ids=["blob-is-a-tensor", "blob-is-the-arena"],
)
def test_name_clashes_are_refused(tensors: dict, blobs: dict) -> None:
    with pytest.raises(ValueError, match=r"also tensor names|names the blob arena"):
        pack({}, tensors, blobs)


def test_a_tensor_named_like_the_arena_is_refused() -> None:
    arena_like = torch.randint(0, 100, (8,), dtype=torch.int64).view(torch.uint64)
    blob = torch.randint(0, 256, (10,), dtype=torch.uint8)
    with pytest.raises(ValueError):
        pack({}, {ARENA: arena_like}, {"blob": blob})


@pytest.mark.parametrize(
    "blob",
    [
        torch.ones(4, dtype=torch.int8),
        torch.ones(2, 2, dtype=torch.uint8),
        torch.ones(8, dtype=torch.uint8)[::2],
    ],
    ids=["int8", "2-d", "strided"],
)
def test_blobs_are_contiguous_byte_vectors(blob: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="contiguous 1-d uint8"):
        pack({}, {}, {"b": blob})


def _edit_header(data: bytes, edit: Callable[[dict], None]) -> bytes:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    edit(header)
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


def _set_index(value: Any) -> Callable[[dict], None]:
    def edit(header: dict) -> None:
        header["__metadata__"]["arena"] = value if isinstance(value, str) else json.dumps(value)

    return edit


def _index_of(data: bytes) -> dict[str, list[int]]:
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    return json.loads(header["__metadata__"]["arena"])


def _arena_dtype(header: dict) -> None:
    header[ARENA]["dtype"] = "F32"
    header[ARENA]["shape"] = [header[ARENA]["shape"][0] * 2]


def _no_arena(header: dict) -> None:
    header["__metadata__"]["arena"] = json.dumps({"blob": [0, 0]})
    spec = header.pop(ARENA)
    header["pad"] = {**spec, "dtype": "U8", "shape": [spec["data_offsets"][1]]}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set_index("{not json"), "index unreadable"),
        (_set_index([[0, 4]]), "index unreadable"),
        (_set_index({"a": [0]}), "index unreadable"),
        (_set_index({"a": 5}), "index unreadable"),
        (_set_index({"a": ["x", "y"]}), "index unreadable"),
        (_set_index({"a": [8, 16]}), "bytes 8..16"),
        (_set_index({"a": [0, 1 << 20]}), "of an arena of"),
        (_set_index({"a": [64, 0]}), "bytes 64..0"),
        (_set_index({"a": [-64, 0]}), "bytes -64..0"),
        (_arena_dtype, "without its uint64 arena"),
        (_no_arena, "without its uint64 arena"),
    ],
    ids=["not-json", "a-list", "short-range", "not-a-range", "not-numbers", "misaligned",
         "past-the-end", "reversed", "negative", "arena-dtype", "no-arena"],
)  # fmt: skip
def test_a_malformed_arena_index_is_refused(edit: Callable[[dict], None], message: str) -> None:
    data = pack({}, _plain(), {"blob": torch.randint(0, 256, (100,), dtype=torch.uint8)})
    with pytest.raises(ValueError, match=message):
        unpack(_edit_header(data, edit))


def test_an_arena_index_naming_a_tensor_is_refused() -> None:
    plain = _plain(seed=8)
    data = pack({}, plain, {"blob": torch.randint(0, 256, (100,), dtype=torch.uint8)})
    index = _index_of(data)
    index["w"] = index.pop("blob")
    with pytest.raises(ValueError):
        unpack(_edit_header(data, _set_index(index)))


# --- end to end through the artifact cache ------------------------------------------------------


@needs_packs
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_warm_start_imports_every_prepacked_weight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    cache = tmp_path / "cache"
    model = net(dtype)
    xs = inputs(range(10, 14), dtype)
    expected, cold = _cold(model, cache, xs)
    steps = _const_weight_steps(cold)
    assert len(steps) == 6, [s.call.detail for s in cold.plan.steps]
    store, key = stax_entry(cache)
    doc, tensors = unpack(store.get(key) or b"")
    keys = set(doc["plan"]["prepacked"])
    assert len(keys) == len(steps)
    # NOTE: the entry holds the bytes the cold program computed with
    for k, p in cold.prepacked().items():
        assert torch.equal(tensors[f"{PACKED}data:{k}"], p.data), k
        assert torch.equal(tensors[f"{PACKED}md:{k}"], p.md), k
        # NOTE: a conv weight's finiteness is saved with it (an entry is found by its
        # constants' hash): a warm start does not read the weight again to learn it
        finite = {"finite": True} if ":conv2d:" in k else {}
        assert doc["plan"]["prepacked"][k] == {
            "shape": list(p.shape),
            "dtype": str(dtype).removeprefix("torch."),
            **finite,
        }
    with monkeypatch.context() as m:
        _refuse_prepare(m)
        m.setattr(PreparedWeight, "_read_finite", _refuse_read)
        saved = load_compiled(store, key)
        assert saved is not None and saved.program is not None
        program = saved.program
        outs = [call_program(program, x) for x in xs]
    packs = program.plan.packs
    assert set(packs.saved) == set(packs.made) == keys and packs.unusable == {}
    details = _onednn_details(program)
    assert len(details) == len(steps) and all(LOADED in d for d in details), details
    for k, (weight, fixed) in packs.made.items():
        assert weight.source is fixed and weight.keep is packs.saved[k].data
        assert torch.ops.mkldnn.data_ptr(weight.value) == weight.keep.data_ptr()
        assert weight.keep.data_ptr() % ALIGN == 0, k
        assert torch.equal(weight.value.to_dense(), fixed), k
    for x, out, cold_out in zip(xs, outs, expected):
        assert torch.equal(out, cold_out)
        assert torch.equal(out, call_program(cold, x))
    with torch.no_grad():
        report = plait.conformance.check(
            model, lambda x: call_program(program, x),
            lambda s: tuple(inputs(range(s, s + 1), dtype)),
            candidate_module=model, op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)


@needs_packs
def test_a_warm_compile_in_process_reorders_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    xs = inputs(range(20, 23))
    expected, _ = _cold(net(), cache, xs)
    with monkeypatch.context() as m:
        _refuse_prepare(m)
        compiled = plait.compile(net(), options={"cache": str(cache), **ONEDNN_LINEARS})
        with torch.no_grad():
            outs = [compiled(x) for x in xs]
    spec = compiled.specializations[-1]
    assert status(spec) == "hit"
    details = _onednn_details(spec.compiled.program)
    assert len(details) == 6 and all(LOADED in d for d in details), details
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))


@needs_packs
def test_weights_shared_across_geometries_get_a_pack_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    torch.manual_seed(3)
    model = Shared().eval()
    xs = inputs(range(30, 33))
    expected, cold = _cold(model, cache, xs)
    for x, y in zip(xs, expected):
        with torch.no_grad():
            torch.testing.assert_close(y, model(x))
    store, key = stax_entry(cache)
    doc, _ = unpack(store.get(key) or b"")
    keys = sorted(doc["plan"]["prepacked"])
    # NOTE: two input sizes, two layouts; the same size twice shares one
    assert len(keys) == 2 and len(_const_weight_steps(cold)) == 3, keys
    assert len({k.split(":")[0] for k in keys}) == 1
    with monkeypatch.context() as m:
        _refuse_prepare(m)
        saved = load_compiled(store, key)
        assert saved is not None
        outs = [call_program(saved.program, x) for x in xs]
    details = _onednn_details(saved.program)
    assert len(details) == 3 and all(LOADED in d for d in details), details
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))


@needs_packs
def test_a_cold_compile_prepacks_each_constant_weight_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_prepare(monkeypatch)
    compiled = plait.compile(net(), options={"cache": str(tmp_path / "cache"), **ONEDNN_LINEARS})
    x1, x2 = inputs(range(40, 42))
    with torch.no_grad():
        compiled(x1)
        after_first = len(calls)
        compiled(x2)
    program = compiled.specializations[-1].compiled.program
    steps = _const_weight_steps(program)
    assert len(steps) == 6
    assert after_first == len(calls) == len(steps), [type(w).__name__ for _, w in calls]
    assert len({id(w) for w, _ in calls}) == len(steps)
    consts = {id(t) for t in program.graph.constants.values()}
    assert all(id(t) in consts for _, t in calls), "a weight was prepacked from a stand-in"
    # NOTE: the same, with the compile and the calls apart (compile_graph: no cache)
    from plait.runtime import compile_graph

    calls.clear()
    again = compile_graph(program.graph, options=program.options)
    compiled_only = len(calls)
    for x in (x1, x2):
        assert torch.equal(call_program(again, x), call_program(program, x))
    assert compiled_only == len(calls) == len(steps)


def test_a_refused_fused_call_does_not_reorder_its_weight_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """oneDNN refusing a fused call (some builds refuse the residual post-op) makes the node an
    unfused call: it reuses the weight the refused call prepared (same key, same layout)."""
    from plait.codegen import onednn

    def refuse(*args: object) -> object:
        raise RuntimeError("could not create a memory")

    monkeypatch.setattr(onednn, "conv_binary", refuse)
    calls = _count_prepare(monkeypatch)
    compiled = plait.compile(net(), options={"cache": False, **ONEDNN_LINEARS})
    x1, x2 = inputs(range(50, 52))
    with torch.no_grad():
        got = [compiled(x) for x in (x1, x2)]
    program = compiled.specializations[-1].compiled.program
    assert program.plan.unfused, "the residual conv was expected to run unfused"
    consts = {id(t) for t in program.graph.constants.values()}
    assert all(id(t) in consts for _, t in calls), "a weight was prepacked from a stand-in"
    assert len(calls) == len({id(t) for _, t in calls}) == len(_const_weight_steps(program))
    model = net()
    with torch.no_grad():
        report = plait.conformance.check(
            model, compiled, lambda s: tuple(inputs(range(s, s + 1))), candidate_module=model,
            op_class="model", draws=2,
        )  # fmt: skip
    assert report.ok, str(report)
    assert all(torch.isfinite(y).all() for y in got)


@needs_packs
def test_an_unusable_saved_pack_is_reordered_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    xs = inputs(range(50, 53))
    expected, _ = _cold(net(), cache, xs)
    store, key = stax_entry(cache)

    def refuse(*args: Any) -> Any:
        raise packed.PackedUnavailable("no shim in this test")

    with monkeypatch.context() as m:
        m.setattr(packed, "import_packed", refuse)
        calls = _count_prepare(m)
        saved = load_compiled(store, key)
        assert saved is not None
        outs = [call_program(saved.program, x) for x in xs]
    packs = saved.program.plan.packs
    assert set(packs.unusable) == set(packs.saved) and len(packs.saved) == 6
    assert all(r == "no shim in this test" for r in packs.unusable.values())
    assert len(calls) == len(packs.saved)
    assert all(w.keep is None and w.value.is_mkldnn for w, _ in packs.made.values())
    details = _onednn_details(saved.program)
    assert len(details) == 6, details
    assert all(f"{UNUSABLE}no shim in this test" in d and LOADED not in d for d in details)
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))


@needs_packs
def test_a_rebuild_reads_the_entry_natively_only_once_it_is_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plait.cache import store as store_mod

    cache = tmp_path / "cache"
    xs = inputs(range(70, 73))
    expected, store, key, dropped = _entry_and_a_conv_pack(cache, xs)

    def drop(doc: dict, tensors: dict, blobs: dict) -> None:
        # NOTE: a well-formed entry without one weight's pack: the rebuild reorders that one
        del doc["plan"]["prepacked"][dropped]
        del blobs[f"{PACKED}data:{dropped}"], blobs[f"{PACKED}md:{dropped}"]

    _rewrite(store, key, drop)
    pendings: list[Any] = []
    seen: list[tuple[str, bool]] = []
    get_pending, real_import = store_mod.LocalStore.get_pending, packed.import_packed
    real_prepare = PreparedWeight.prepare

    # NOTE: the check finishes only once the reorder job has reached the entry (asked for the
    # check, or, were it ungated, started reading) and the rebuild has returned: a native read
    # that does not wait for the check is made while it is pending, however threads are scheduled
    reached = threading.Event()

    def get_pending_spy(self: Any, k: str) -> Any:
        pending = get_pending(self, k)
        loader, check = threading.get_ident(), pending.check

        def check_after_the_reorder_reached_it() -> None:
            assert reached.wait(120), "no reorder job reached the entry"
            check()

        pending.check = check_after_the_reorder_reached_it
        verified = held.hold(pending).verified

        def verified_spy() -> Any:
            if threading.get_ident() != loader:
                reached.set()
            return verified()

        pending.verified = verified_spy  # type: ignore[method-assign]
        pendings.append(pending)
        return pending

    def import_spy(*args: Any) -> Any:
        seen.append(("import", all(p.check is None for p in pendings)))
        return real_import(*args)

    def prepare_spy(self: PreparedWeight, w: torch.Tensor) -> None:
        seen.append(("reorder", all(p.check is None for p in pendings)))
        reached.set()
        real_prepare(self, w)

    with monkeypatch.context() as m:
        held = held_checks(m)
        m.setattr(store_mod.LocalStore, "get_pending", get_pending_spy)
        m.setattr(packed, "import_packed", import_spy)
        m.setattr(PreparedWeight, "prepare", prepare_spy)
        saved = load_compiled(store, key)
        assert saved is not None
        outs = [call_program(saved.program, x) for x in xs]
    assert len(pendings) == 1 and held.stuck == []
    packs = saved.program.plan.packs
    # NOTE: every native read of the entry (oneDNN's descriptor imports, the one reorder) came
    # after its hash check, although the rebuild itself did not wait for it
    assert sorted(seen) == [("import", True)] * (len(packs.saved)) + [("reorder", True)]
    assert dropped not in packs.saved and packs.unusable == {} and packs.queued == []
    details = _onednn_details(saved.program)
    assert sum(LOADED in d for d in details) == len(details) - 1
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))


@needs_packs
def test_a_saved_pack_of_the_wrong_size_is_reordered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    xs = inputs(range(60, 63))
    expected, store, key, short = _entry_and_a_conv_pack(cache, xs)

    def cut(doc: dict, tensors: dict, blobs: dict) -> None:
        blobs[f"{PACKED}data:{short}"] = blobs[f"{PACKED}data:{short}"][:-ALIGN].clone()

    _rewrite(store, key, cut)
    with monkeypatch.context() as m:
        calls = _count_prepare(m)
        saved = load_compiled(store, key)
        assert saved is not None
        outs = [call_program(saved.program, x) for x in xs]
    packs = saved.program.plan.packs
    assert set(packs.unusable) == {short}
    assert "bytes for a descriptor of" in packs.unusable[short]
    assert [id(w) for w, _ in calls] == [id(packs.made[short][0])]
    details = _onednn_details(saved.program)
    assert sum(UNUSABLE in d for d in details) == 1
    assert sum(LOADED in d for d in details) == len(details) - 1
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))


@needs_packs
@pytest.mark.parametrize("part", ["data", "md"])
def test_an_entry_missing_a_pack_is_discarded_and_rebuilt(tmp_path: Path, part: str) -> None:
    cache = tmp_path / "cache"
    xs = inputs(range(70, 72))
    expected, _ = _cold(net(), cache, xs)
    store, key = stax_entry(cache)

    def drop(doc: dict, tensors: dict, blobs: dict) -> None:
        first = min(doc["plan"]["prepacked"])
        del blobs[f"{PACKED}{part}:{first}"]

    _rewrite(store, key, drop)
    with pytest.raises(StaleEntryError, match="missing from the entry"):
        load_compiled(store, key)
    with pytest.warns(CacheWarning, match="discarded"):
        compiled = plait.compile(net(), options={"cache": str(cache), **ONEDNN_LINEARS})
        with torch.no_grad():
            outs = [compiled(x) for x in xs]
    spec = compiled.specializations[-1]
    assert status(spec) == "miss"
    (event,) = spec.manifest.cache["events"]
    assert "missing from the entry" in event and "rebuilt" in event
    assert all(torch.equal(a, b) for a, b in zip(outs, expected))
    assert LocalStore(cache).verify().ok
    again = plait.compile(net(), options={"cache": str(cache), **ONEDNN_LINEARS})
    with torch.no_grad():
        assert torch.equal(again(xs[0]), expected[0])
    assert status(again.specializations[-1]) == "hit"


@needs_packs
@pytest.mark.parametrize("dtype", ["Tensor", "no_such_dtype"])
def test_an_entry_with_a_pack_of_no_dtype_is_stale(tmp_path: Path, dtype: str) -> None:
    cache = tmp_path / "cache"
    _cold(net(), cache, inputs(range(80, 81)))
    store, key = stax_entry(cache)

    def retype(doc: dict, tensors: dict, blobs: dict) -> None:
        doc["plan"]["prepacked"][min(doc["plan"]["prepacked"])]["dtype"] = dtype

    _rewrite(store, key, retype)
    with pytest.raises(StaleEntryError):
        load_compiled(store, key)


# --- across processes ---------------------------------------------------------------------------

CHILD = """
import json, sys, warnings
warnings.simplefilter("error")
import torch
import plait
from plait.codegen.extern import PreparedWeight
from tests.cache.test_prepacked_entry import ONEDNN_LINEARS, inputs, net
mode, cache = sys.argv[1], sys.argv[2]
if mode == "warm":
    def prepare(self, w):
        raise AssertionError("a prepacked weight was reordered on a warm start")

    PreparedWeight.prepare = prepare
compiled = plait.compile(net(), options={"cache": cache, **ONEDNN_LINEARS})
with torch.no_grad():
    outs = [compiled(x) for x in inputs(range(90, 93))]
spec = compiled.specializations[0]
print(json.dumps({
    "status": spec.manifest.cache["status"],
    "details": [t.detail for t in spec.compiled.program.evidence.nodes.values()
                if t.detail.startswith("oneDNN")],
    "outs": [o.numpy().tobytes().hex() for o in outs],
}))
"""


def _child(cache: Path, mode: str) -> dict:
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(cache)],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_packs
@pytest.mark.slow
def test_a_warm_process_imports_every_prepacked_weight(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = _child(cache, "cold")
    assert cold["status"] == "miss" and len(cold["details"]) == 6
    assert not any(LOADED in d for d in cold["details"])
    warm = _child(cache, "warm")
    assert warm["status"] == "hit"
    assert len(warm["details"]) == 6 and all(LOADED in d for d in warm["details"])
    assert warm["outs"] == cold["outs"]  # NOTE: bit for bit
    assert len(set(cold["outs"])) == len(cold["outs"])


LIFETIME = """
import gc, sys, torch
from plait.cache import LocalStore
from plait.cache.compiled import load_compiled
store = LocalStore(sys.argv[1])
(entry,) = [e for e in store.list() if e.meta.get("executor") == "stax"]
saved = load_compiled(store, entry.key)
packs = saved.program.prepacked()
before = {k: p.data.clone() for k, p in packs.items()}
del saved
gc.collect()
junk = [torch.full((1 << 20,), 7, dtype=torch.uint8) for _ in range(32)]
bad = [k for k, p in packs.items() if not torch.equal(p.data, before[k])]
print("changed:", bad)
sys.exit(1 if bad else 0)
"""


@needs_packs
@pytest.mark.slow
def test_the_packs_of_a_rebuilt_program_outlive_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _cold(net(), cache, inputs(range(95, 96)))
    environ = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", LIFETIME, str(cache)],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])


@needs_packs
def test_the_packs_of_a_cold_program_outlive_it(tmp_path: Path) -> None:
    _, cold = _cold(net(), tmp_path / "cache", inputs(range(96, 97)))
    packs = cold.prepacked()
    before = {k: (p.data.clone(), p.md.clone()) for k, p in packs.items()}
    assert len(packs) == 6
    del cold
    gc.collect()
    junk = [torch.randn(1 << 16) for _ in range(16)]
    assert junk
    for k, p in packs.items():
        assert torch.equal(p.data, before[k][0]) and torch.equal(p.md, before[k][1]), k

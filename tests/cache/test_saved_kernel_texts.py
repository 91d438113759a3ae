"""A saved Stax program records each C++ kernel's text under the digest of the kernel's structure;
its rebuild takes the text of a kernel with that digest instead of printing it, and still refuses
a program whose kernels' hashes differ from the recorded ones."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch

import plait.runtime.program as program_mod
from plait.cache.artifact import unpack
from plait.cache.compiled import load_compiled
from plait.codegen.cpp import PrintOptions, print_kernel
from plait.codegen.index import Ix, Var
from plait.codegen.kernel_digest import structure_digest
from plait.codegen.kir import KernelBuilder
from plait.ir.persist import Blobs, graph_from_doc
from plait.runtime.program_doc import ProgramDocError, program_from_doc
from tests.cache.helpers import call_program, convnet, run, sample, stax_entry


def _saved_doc(cache: Path) -> tuple[dict[str, Any], Blobs]:
    store, key = stax_entry(cache)
    pending = store.get_pending(key)
    assert pending is not None
    doc, tensors = unpack(pending.payload)
    pending.verified()
    return doc, Blobs(tensors, pending.verified)


def _no_printing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("a kernel was printed while rebuilding a saved program")

    monkeypatch.setattr(program_mod, "print_kernel", refuse)


def test_a_rebuild_prints_no_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    _, spec = run(convnet(), sample(), cache)
    compiled = spec.compiled.program
    assert compiled.kernels, "the model must have native kernels for this test to mean anything"
    store, key = stax_entry(cache)
    with monkeypatch.context() as m:
        _no_printing(m)
        saved = load_compiled(store, key)
    assert saved is not None and saved.program is not None
    rebuilt = saved.program
    assert [k.source for k in rebuilt.kernels] == [k.source for k in compiled.kernels]
    fresh = sample(seed=7)
    assert torch.equal(call_program(rebuilt, fresh), call_program(compiled, fresh))


def test_texts_under_unknown_digests_are_printed_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _, spec = run(convnet(), sample(), cache)
    doc, blobs = _saved_doc(cache)
    plan = doc["plan"]
    (text,) = set(plan["printed"].values())
    plan["printed"] = {"0" * 64: text}
    rebuilt = program_from_doc(graph_from_doc(doc, blobs), plan, blobs)
    compiled = spec.compiled.program
    assert [k.source for k in rebuilt.kernels] == [k.source for k in compiled.kernels]


def test_a_text_unlike_the_recorded_kernel_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run(convnet(), sample(), cache)
    doc, blobs = _saved_doc(cache)
    printed = doc["plan"]["printed"]
    assert printed, "the model must have a native kernel for this test to mean anything"
    for digest in printed:
        printed[digest] += "\n// a text other than the one the compile printed\n"
    with pytest.raises(ProgramDocError, match="not one of the recorded kernels"):
        program_from_doc(graph_from_doc(doc, blobs), doc["plan"], blobs)


def test_malformed_texts_are_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    run(convnet(), sample(), cache)
    doc, blobs = _saved_doc(cache)
    doc["plan"]["printed"] = ["not", "a", "mapping"]
    with pytest.raises(ProgramDocError, match="kernel texts are malformed"):
        program_from_doc(graph_from_doc(doc, blobs), doc["plan"], blobs)


def _kernel(const: float = 1.0, dtype: str = "f32", stride: int = 1, op: str = "add") -> Any:
    b = KernelBuilder("k", outer=(Var("i0", 8),))
    x, y = b.buffer("x", dtype, 8 * stride), b.buffer("y", dtype, 8, output=True)
    i = Ix.var(b.outer[0])
    loaded = b.load(x, i * stride)
    b.store(y, i, b.op(op, [loaded, b.const(const, dtype)], dtype))
    return b.build(nodes=(0,))


def test_the_digest_tells_apart_what_printing_reads() -> None:
    base = structure_digest(_kernel())
    assert structure_digest(_kernel()) == base
    variants = [
        _kernel(const=2.0),
        _kernel(const=float("nan")),
        _kernel(dtype="f64"),
        _kernel(stride=2),
        _kernel(op="mul"),
    ]
    digests = [structure_digest(k) for k in variants]
    assert base not in digests and len(set(digests)) == len(digests)


def test_the_digest_ignores_the_graph_nodes() -> None:
    moved = _kernel()
    moved.nodes = (41, 42)
    assert structure_digest(moved) == structure_digest(_kernel())


def _variant(
    const: float | int = 1.0,
    dtype: str = "f32",
    index: str = "plain",
    reduce: str | None = None,
    cast: str | None = None,
    extent: int = 8,
) -> Any:
    b = KernelBuilder("k", outer=(Var("i0", extent),), inner=(Var("r0", 4),) if reduce else ())
    x = b.buffer("x", dtype, extent * 8 + 8)
    y = b.buffer("y", dtype, extent, output=True)
    i = Ix.var(b.outer[0])
    maps = {"plain": i, "offset": i + 3, "strided": i * 3, "broadcast": i.mod(4), "clamped": i}
    maps.update(halved=i.div(2), clamped=(i - 2).clamp(0, extent - 1))
    at = maps[index] + (Ix.var(b.inner[0]) * extent if reduce else Ix.lit(0))
    value = b.op("add", [b.load(x, at), b.const(const, dtype)], dtype)
    if cast:
        value = b.cast(b.cast(value, cast), dtype)
    if reduce:
        b.store_final(y, i, b.reduce(reduce, value, dtype))
    else:
        b.store(y, i, value)
    return b.build(nodes=(0,))


def test_kernels_with_one_digest_print_one_text() -> None:
    """Equal digests mean equal printed text, over constants that differ only in bits (signed
    zeros, NaN payloads, denormals, an int against a float, large ints), index maps (offsets,
    strides, broadcasts), reductions, casts and extents that cross the parallel threshold."""
    payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    kernels = [
        *[_variant(const=c) for c in (0.0, -0.0, float("nan"), payload, 1e-45, 5e-324, 1.0)],
        *[_variant(const=c, dtype="i64") for c in (1, 2**53, 2**53 + 1, 2**62, -(2**63))],
        *[_variant(dtype="f64", const=c) for c in (1.0, 1.0 + 2**-52)],
        *[_variant(index=m) for m in ("offset", "strided", "broadcast", "halved", "clamped")],
        *[_variant(reduce=r) for r in ("sum", "prod", "max", "min")],
        *[_variant(cast=c) for c in ("i32", "i64", "u8", "f64", "b")],
        *[_variant(extent=n) for n in (1, 1 << 17, (1 << 17) + 1)],
    ]
    for options in (PrintOptions(), PrintOptions(parallel_threshold=16)):
        texts: dict[str, str] = {}
        for kernel in kernels:
            text = print_kernel(kernel, "STAX_SYMBOL", options)
            assert texts.setdefault(structure_digest(kernel), text) == text
        # NOTE: the variants do print differently (only NaN payloads print alike)
        assert len(set(texts.values())) == len(kernels) - 1

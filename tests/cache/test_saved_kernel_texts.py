"""A saved Stax program records each C++ kernel's text under the digest of the kernel's structure;
its rebuild takes the text of a kernel with that digest instead of printing it, and still refuses
a program whose kernels' hashes differ from the recorded ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import plait.runtime.program as program_mod
from plait.cache.artifact import unpack
from plait.cache.compiled import load_compiled
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

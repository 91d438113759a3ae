"""Triton autotuning (``StaxOptions.triton_autotune``) through Triton's interpreter on CPU tensors:
each kernel's candidate launch shapes are timed, the fastest kept and cached with the kernel; a
later compile reads the choice and times nothing; tuning changes no bit of any result."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import copy
from pathlib import Path

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)

import plait
import plait.conformance
from benchmarks.models.gpt2 import GPT2, GPT2Config
from plait.codegen.triton_blocks import candidate_blocks, default_blocks
from plait.runtime import StaxOptions, compile_graph


def _model() -> torch.nn.Module:
    cfg = GPT2Config(vocab_size=50, block_size=16, n_layer=1, n_head=2, d_model=16, dropout=0.0)
    torch.manual_seed(0)
    return GPT2(cfg).eval()


def _ids(seed: int) -> torch.Tensor:
    return torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(seed))


def _compiled(model: torch.nn.Module, autotune: bool) -> plait.api.CompiledModule:
    stax = {"target": "triton", "triton_autotune": autotune}
    return plait.compile(model, backend="stax", options={"stax": stax})


def _kernels(compiled: plait.api.CompiledModule) -> list[dict]:
    (spec,) = compiled.specializations
    return spec.manifest.kernels["kernels"]


def test_tuned_kernels_are_timed_once_cached_and_compute_the_same_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    model = _model()
    tuned, plain = _compiled(copy.deepcopy(model), True), _compiled(copy.deepcopy(model), False)
    with torch.no_grad():
        report = plait.conformance.check(
            model, tuned, (_ids(1),), draws=2, candidate_module=tuned, seed=0, stress=None
        )
        assert report.ok, str(report)
        for seed in (2, 3):
            assert torch.equal(tuned(_ids(seed)), plain(_ids(seed)))
    # NOTE: the tuning the user asked for shows progress on stderr; the plain compile shows none
    assert capsys.readouterr().err.count("tuning Triton kernels ...") == 1
    records = [k["tuning"] for k in _kernels(tuned)]
    assert records and all(not r["cached"] and r["candidates"] >= 2 for r in records)
    assert all(len(r["us"]) == r["candidates"] for r in records)
    assert all("tuning" not in k for k in _kernels(plain))
    # NOTE: the same graph built again (not through the artifact cache, which would reuse the
    # program): every choice read from the kernel cache, nothing timed
    (spec,) = tuned.specializations
    graph = spec.compiled.program.graph
    again = compile_graph(graph, options=StaxOptions(target="triton", triton_autotune=True))
    cached = [k.tuning for k in again.kernels]
    assert [r["blocks"] for r in cached] == [r["blocks"] for r in records]
    assert all(r["cached"] and "us" not in r for r in cached)


def test_candidates_start_with_the_heuristic_and_keep_its_reduction_chunk() -> None:
    from plait.codegen.index import Ix, Var
    from plait.codegen.kir import KernelBuilder

    b = KernelBuilder("k", outer=(Var("i0", 64),), inner=(Var("r0", 300),))
    x = b.buffer("x", "f32", 64 * 300)
    y = b.buffer("y", "f32", 64, output=True)
    i, r = Ix.var(b.outer[0]), Ix.var(b.inner[0])
    b.store_final(y, i, b.reduce("sum", b.load(x, i * 300 + r), "f32"))
    kernel = b.build(nodes=())
    found = candidate_blocks(kernel)
    assert found[0] == default_blocks(kernel)
    assert len(set(found)) == len(found) >= 2
    assert {c.rblock for c in found} == {default_blocks(kernel).rblock}

"""Triton kernels with symbolic sizes, through Triton's interpreter on CPU tensors: each program is
compiled once with ``dynamic=True`` on the Triton target, then run at random sizes (none equal
to 1, which specializes; many not a multiple of any block) and judged by the conformance gate
against eager. One specialization serves every size, run by Triton kernels that take the sizes
as arguments (the manifest's executor says Triton, no fallback, no interpreter)."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import random
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)
from hypothesis import given, settings
from hypothesis import strategies as st

import plait
import plait.conformance
from benchmarks.models.gpt2 import Block, GPT2Config
from plait.codegen.plan import KernelStep
from tests.dynamic.test_symbolic_kernels import PROGRAMS as CPP_PROGRAMS

TRITON = {"cache": False, "stax": {"target": "triton"}}


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    n = x.shape[-1]
    return x.sum(-1), x.amax(-1), x.softmax(-1), F.layer_norm(x, (n,))


# NOTE: name -> (program, inputs at two sizes >= 2); the row length is the second size
PROGRAMS: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[torch.Tensor, ...]]]] = {
    "pointwise_chain": (
        lambda x: ((x * 1.5 - 0.25).relu().sigmoid() * x).tanh().exp(),
        lambda a, b: (torch.randn(a, b),),
    ),
    "broadcast": (
        lambda x, y, z: (x + y) * z - y.exp(),
        lambda a, b: (torch.randn(a, b), torch.randn(1, b), torch.randn(a, 1)),
    ),
    "row_reductions": (_rows, lambda a, b: (torch.randn(a, b),)),
}


@cache
def _compiled(name: str) -> Any:
    """Compiled once, at sizes no other size of the program equals (equal sizes share a
    symbol, and a guard then holds them equal)."""
    fn, make = PROGRAMS[name]
    compiled = plait.compile(fn, backend="stax", dynamic=True, fullgraph=True, options=TRITON)
    with torch.no_grad():
        compiled(*make(5, 7))
    return compiled


def _judged(fn: Callable[..., Any], compiled: Any, inputs: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad():
        report = plait.conformance.check(fn, compiled, inputs, draws=1)
    assert report.ok, str(report)


def _one_triton_specialization(compiled: Any) -> list[str]:
    """Exactly one compile, run by symbolic Triton kernels: their sources."""
    report = plait.explain(compiled)
    assert len(report.specializations) == 1, compiled.recompile_reasons
    manifest = report.specializations[0].manifest
    ex = manifest.executor
    assert ex["backend"] == "stax" and ex["target"] == "triton", ex
    assert manifest.fallbacks == [] and ex["evidence"]["counts"]["fallback"] == 0
    assert ex["cuda_graph"]["used"] is False
    kernels = manifest.kernels["kernels"]
    assert kernels and all(k["symbol"].startswith("triton_") for k in kernels)
    program = compiled.specializations[0].compiled.program
    sources = [k.source for k in program.kernels]
    # NOTE: a kernel over static dims only (a constant mask) stays static
    assert any("do_not_specialize" in s for s in sources), sources[0]
    return sources


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_compile_serves_random_sizes(name: str) -> None:
    fn, make = PROGRAMS[name]
    compiled = _compiled(name)
    rng = random.Random(name)
    sizes = [(rng.randint(2, 40), rng.randint(2, 300)) for _ in range(3)] + [(3, 1100)]
    for a, b in sizes:
        _judged(fn, compiled, make(a, b))
    _one_triton_specialization(compiled)


def test_a_symbolic_row_is_reduced_in_a_loop_to_its_end() -> None:
    """Rows far longer than the block the hints chose (7 elements: a block of 8) are summed to
    their end: the row loop runs until the row's length, read at run time."""
    fn, make = PROGRAMS["row_reductions"]
    compiled = _compiled("row_reductions")
    x = make(2, 2500)[0]
    _judged(fn, compiled, (x,))
    sources = _one_triton_specialization(compiled)
    assert any("while roffset < " in s for s in sources)


@settings(max_examples=8, deadline=None)
@given(a=st.integers(2, 33), b=st.integers(2, 200))
def test_symbolic_kernels_agree_with_concrete_execution(a: int, b: int) -> None:
    fn, make = PROGRAMS["broadcast"]
    compiled = _compiled("broadcast")
    _judged(fn, compiled, make(a, b))
    _one_triton_specialization(compiled)


@cache
def _compiled_like_cpp(name: str) -> Any:
    """A program of the C++ target's symbolic suite (views with compound sizes such as
    ``ceiling(s1/2)``, selections, integer math, reductions over either dim, attention's head
    split), on Triton."""
    fn, make = CPP_PROGRAMS[name]
    compiled = plait.compile(fn, backend="stax", dynamic=True, fullgraph=True, options=TRITON)
    with torch.no_grad():
        compiled(*make(5, 7))
    return compiled


@pytest.mark.parametrize("name", sorted(CPP_PROGRAMS))
def test_the_symbolic_suite_agrees_with_eager_on_triton(name: str) -> None:
    fn, make = CPP_PROGRAMS[name]
    compiled = _compiled_like_cpp(name)
    _judged(fn, compiled, make(3, 11))
    _one_triton_specialization(compiled)


def test_transformer_block_serves_batch_sizes_and_sequence_lengths() -> None:
    torch.manual_seed(0)
    cfg = GPT2Config(block_size=64, n_head=2, d_model=16, attention="explicit")
    model = Block(cfg).eval()
    compiled = plait.compile(model, backend="stax", dynamic=True, fullgraph=True, options=TRITON)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        compiled(torch.randn(2, 9, 16, generator=gen))
    for batch, seq in ((3, 5), (2, 17), (4, 33)):
        x = torch.randn(batch, seq, 16, generator=gen)
        with torch.no_grad():
            report = plait.conformance.check(model, compiled, (x,), draws=1, candidate_module=model)
        assert report.ok, f"{batch}x{seq}: {report}"
    _one_triton_specialization(compiled)


# NOTE: compiles printed kernels for a Hopper GPU with no GPU present (Triton's own ptxas);
# run in a child without TRITON_INTERPRET, which decides what ``@triton.jit`` makes.
_COMPILE_FOR_GPU = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.language.extra.cuda import libdevice

for i, (symbol, text, pointers, warps) in enumerate(json.load(sys.stdin)):
    path = f"{sys.argv[1]}/k{i}.py"
    open(path, "w").write(text)
    spec = importlib.util.spec_from_file_location(f"k{i}", path)
    module = importlib.util.module_from_spec(spec)
    module.M = libdevice
    sys.modules[f"k{i}"] = module
    spec.loader.exec_module(module)
    fn = getattr(module, symbol)
    sizes = fn.arg_names[len(pointers):]
    signature = {**dict(zip(fn.arg_names, pointers)), **{n: "i32" for n in sizes}}
    options = {"num_warps": warps, "enable_fp_fusion": False}
    compiled = triton.compile(ASTSource(fn, signature), target=GPUTarget("cuda", 90, 32),
                              options=options)
    assert compiled.asm["cubin"], symbol
print("compiled", i + 1)
"""


def test_symbolic_kernels_compile_for_a_gpu(tmp_path: Any) -> None:
    """The interpreter accepts more than the compiler: every symbolic kernel of the row
    reductions and the GPT-2 block also compiles to a Hopper binary (the ``while`` row loop,
    the int64 sizes, ``do_not_specialize``)."""
    import json
    import subprocess
    import sys

    import triton.backends.nvidia.compiler  # noqa: F401  (in every Triton wheel: fails, not skips)

    pointer = {torch.float32: "*fp32", torch.int64: "*i64", torch.bool: "*i1"}
    torch.manual_seed(0)
    block = Block(GPT2Config(block_size=64, n_head=2, d_model=16, attention="explicit")).eval()
    compiled = plait.compile(block, backend="stax", dynamic=True, fullgraph=True, options=TRITON)
    with torch.no_grad():
        compiled(torch.randn(2, 9, 16))
    kernels = []
    for c in (compiled, _compiled("row_reductions")):
        program = c.specializations[0].compiled.program
        steps = [s for s in program.plan.steps if isinstance(s, KernelStep)]
        for info, step in zip(program.kernels, steps):
            ts = info.triton
            assert ts.sizes, ts.source
            types = [pointer[v.type.dtype] for v in step.lowered.bindings]
            kernels.append((ts.symbol, ts.source, types, ts.num_warps))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # NOTE: compiled here, not found
    child = subprocess.run(
        [sys.executable, "-c", _COMPILE_FOR_GPU, str(tmp_path)],
        input=json.dumps(kernels),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert f"compiled {len(kernels)}" in child.stdout


def test_a_symbolic_program_is_never_one_cuda_graph() -> None:
    """A captured CUDA graph replays one size's grids and buffers: refused, with the reason."""
    from plait.runtime.cuda_graph import why_not_captured

    program = _compiled("pointwise_chain").specializations[0].compiled.program
    reason = why_not_captured(program, True)
    assert reason is not None and reason.startswith("symbolic sizes"), reason


def test_autotuning_keeps_the_hints_launch_shape_of_symbolic_kernels() -> None:
    """Timing needs sizes: a symbolic kernel is not timed, and its record says so."""
    fn, make = PROGRAMS["row_reductions"]
    stax = {"target": "triton", "triton_autotune": True}
    compiled = plait.compile(
        fn, backend="stax", dynamic=True, fullgraph=True, options={"cache": False, "stax": stax}
    )
    with torch.no_grad():
        compiled(*make(5, 7))
    _judged(fn, compiled, make(3, 40))
    kernels = plait.explain(compiled).specializations[0].manifest.kernels["kernels"]
    records = [k["tuning"] for k in kernels]
    assert records and all(r["skipped"] == "symbolic" and not r["cached"] for r in records)

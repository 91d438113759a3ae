"""Symbolic Stax kernels agree with concrete execution at random sizes (hypothesis): each
program is compiled once with symbolic dims, then run at drawn sizes and judged by the
conformance gate against eager; one specialization serves them all, run by native kernels."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import plait
import plait.conformance


def _attention_piece(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's head split: split, view, transpose (strided views with symbolic strides)."""
    b, t, c = x.shape
    q, k, v = (x @ torch.ones(c, 3 * c)).split(c, dim=2)
    q = q.view(b, t, 2, c // 2).transpose(1, 2)
    k = k.view(b, t, 2, c // 2).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)).softmax(-1)
    mask = torch.ones(16, 16).tril()[:t, :t]
    att = att.masked_fill(mask == 0, 0.0)
    y = att @ v.view(b, t, 2, c // 2).transpose(1, 2)
    return y.transpose(1, 2).contiguous().view(b, t, c)


# NOTE: name -> (program, input maker from two sizes >= 2)
PROGRAMS: dict[str, tuple[Callable[..., Any], Callable[[int, int], tuple[torch.Tensor, ...]]]] = {
    "pointwise_broadcast": (
        lambda x, y: ((x * 1.5 + y).relu().sigmoid() * x - y.exp()).tanh(),
        lambda a, b: (torch.randn(a, b), torch.randn(1, b)),
    ),
    "rowwise": (
        lambda x: (x.softmax(-1), x.log_softmax(0), F.layer_norm(x, (8,))),
        lambda a, b: (torch.randn(a, b, 8),),
    ),
    "reductions": (
        lambda x: (
            x.sum(0),
            x.mean(1, keepdim=True),
            x.var(1),
            x.amax(0),
            x.logsumexp(1),
            (x > 0).all(1),
            torch.count_nonzero(x > 0.5, 0),
            x.mean(),
        ),
        lambda a, b: (torch.randn(a, b),),
    ),
    "views": (
        lambda x: (
            x.t().reshape(-1) * 2,
            x.transpose(0, 1).contiguous().view(-1, 1) + 1,
            x.flatten()[1:] - 1,
            x[:, 1:].sum(1),
            x[1:, ::2] * 3,
        ),
        lambda a, b: (torch.randn(a, b),),
    ),
    "select_ops": (
        lambda x: (
            torch.cat([x, x * 2], 1),
            torch.stack([x, -x], 0),
            F.pad(x, (1, 2)),
            F.pad(x[None], (1, 1), mode="reflect")[0],
            x.flip(0),
            x.roll(1, 1),
            torch.tril(x),
        ),
        lambda a, b: (torch.randn(a, b),),
    ),
    "integers": (
        lambda x: ((x * 10).long() // 3, (x * 10).long() % 4, (x > 0).sum(1)),
        lambda a, b: (torch.randn(a, b),),
    ),
    "attention_piece": (_attention_piece, lambda a, b: (torch.randn(a, min(b, 16), 8),)),
}


@cache
def _compiled(name: str) -> Any:
    """Compiled once, captured at sizes that equal no other size of the program (equal sizes
    share a symbol, and a guard then holds them equal)."""
    fn, make = PROGRAMS[name]
    compiled = plait.compile(
        fn, backend="stax", dynamic=True, fullgraph=True, options={"cache": False}
    )
    with torch.no_grad():
        compiled(*make(5, 7))
    return compiled


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@settings(max_examples=6, deadline=None)
@given(a=st.integers(2, 9), b=st.integers(2, 11))
def test_symbolic_program_matches_eager_at_every_size(name: str, a: int, b: int) -> None:
    fn, make = PROGRAMS[name]
    compiled = _compiled(name)
    with torch.no_grad():
        report = plait.conformance.check(fn, compiled, make(a, b), draws=1)
    assert report.ok, str(report)
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    manifest = plait.explain(compiled).specializations[0].manifest
    assert manifest.executor["backend"] == "stax" and manifest.fallbacks == []
    assert manifest.executor["evidence"]["counts"]["native"] > 0


def test_symbolic_kernels_take_sizes_at_run_time() -> None:
    """The kernels of a symbolic program read their sizes: one build serves every size, and a
    static compile of the same program prints other kernels."""
    compiled = _compiled("rowwise")
    with torch.no_grad():
        compiled(torch.randn(3, 5, 8))
    program = compiled.specializations[0].compiled.program
    sources = [k.source for k in program.kernels]
    assert all("sz_s0" in s for s in sources), sources[0]
    assert "if(parallel: " in sources[0]
    records = program.memory_plan.records()
    assert records["arena_bytes"].startswith("per call")


def test_a_symbolic_reshape_copy_divides_by_no_runtime_size() -> None:
    """A transposing copy into ``(b*t, h*d)`` (attention's heads merged back): its loops over
    ``b*t`` and ``h*d`` are split into loops over each size (``plait.codegen.loops``), so no
    index divides by a size read at run time; the result is eager's bit for bit."""

    def merge_heads(x: torch.Tensor) -> torch.Tensor:
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b * t, h * d) * 2

    compiled = plait.compile(merge_heads, backend="stax", dynamic=True, options={"cache": False})
    for shape in ((2, 3, 5, 7), (3, 4, 6, 8), (4, 2, 9, 3)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[2]))
        assert torch.equal(compiled(x), merge_heads(x))
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    sources = [k.source for k in compiled.specializations[0].compiled.program.kernels]
    assert sources and all("sz_s" in s for s in sources), sources
    assert not any("/ (sz_" in s or "% (sz_" in s for s in sources), sources

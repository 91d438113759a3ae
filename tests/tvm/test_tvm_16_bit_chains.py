"""A chain of 16-bit float ops compiles to a TVM kernel in time linear in its length, and
computes eager's bits. A bfloat16 rounding reads its argument three times (its NaN test and its
bits, twice): inlined, each rounding of a chain tripled the text of the ones before it (a chain
of four multiply-adds took minutes to compile, twelve never finished). An argument that rounds
in turn is read from a local scalar instead. Fresh random inputs, with ties, infinities, NaN,
signed zeros and overflow written in."""

from __future__ import annotations

import math

import pytest
import torch

import plait
from plait.codegen.index import Ix, Var
from plait.codegen.kir import KernelBuilder
from plait.codegen.tvm_script import print_tvm
from tests.util import assert_bitwise

pytestmark = pytest.mark.xdist_group("tvm-16-bit-chains")

STEPS = 12
SPECIALS = (math.inf, -math.inf, math.nan, 0.0, -0.0, 3.0e38, -3.0e38, 1e-40, 2.0**-8, 255.5)


def _chain_source(roundings: int) -> str:
    """The printed kernel of bfloat16 multiplies and adds in turn, each rounded as lowered."""
    kb = KernelBuilder("k", outer=(Var("i0", 8),))
    a, b = kb.buffer("a", "bf16", 8), kb.buffer("b", "bf16", 8)
    out = kb.buffer("o", "bf16", 8, output=True)
    i = Ix.var(kb.outer[0])
    x, y = kb.load(a, i), kb.load(b, i)
    r = x
    for j in range(roundings):
        r = kb.round(kb.op("mul", [r, y], "f32") if j % 2 == 0 else kb.op("add", [r, x], "f32"),
                     "bf16")  # fmt: skip
    kb.store(out, i, r)
    return print_tvm(kb.build(nodes=()), "k").source


def test_a_bfloat16_chain_prints_in_linear_size() -> None:
    small, large = len(_chain_source(6)), len(_chain_source(12))
    assert large < 3 * small, (small, large)
    # NOTE: one rounding reads its argument inline, as before; a second reads it from a scalar
    assert 'scope="local"' not in _chain_source(1)
    assert _chain_source(2).count('scope="local"') == 1


def _inputs(dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(29, 67, generator=gen) * 3
    y = torch.randn(29, 67, generator=gen) * 1.5
    x[0, :8], y[0, :8] = 1.0078125, 1.5  # NOTE: x * y is a tie, 1.5 + 2^-7 + 2^-8
    x[1, :8], y[1, :8] = 1.0, 2.0**-9  # NOTE: x * y + x is a tie, 1 + 2^-8
    at = torch.randperm(x.numel() - 134, generator=gen)[:120] + 134
    for j, k in enumerate(at.tolist()):
        x.view(-1)[k] = SPECIALS[j % len(SPECIALS)]
        y.view(-1)[k] = SPECIALS[(3 * j + 1) % len(SPECIALS)]
    return x.to(dtype), y.to(dtype)


def _nan_canonical(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.isnan(), torch.full_like(t, math.nan), t)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_long_16_bit_chain_compiles_and_is_bitwise_eager(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r = x
        for _ in range(STEPS):
            r = r * y + x
        return r

    f = plait.compile(fn, backend="tvm", options={"cache": False})
    gen = torch.Generator().manual_seed(1612)
    for _ in range(3):
        x, y = _inputs(dtype, gen)
        assert_bitwise(_nan_canonical(f(x, y)), _nan_canonical(fn(x, y)), str(dtype))
    manifest = plait.explain(f).specializations[-1].manifest
    assert {k["printer"] for k in manifest.kernels["kernels"]} == {"tvm"}, manifest.fallbacks

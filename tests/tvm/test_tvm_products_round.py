"""A float product in a TVM kernel is rounded before it is added to, as eager and the C++
kernels (``-ffp-contract=off``) round it: TVM's LLVM target fuses ``a * b + c`` into one FMA
instruction (one rounding) whatever the IR says, unless the product is fenced. Pointwise adds
and multiplies keep eager's order of arithmetic, so the contract's bitwise rule holds: the
compiled values are eager's bits, on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.codegen.index import Ix, Var
from plait.codegen.kir import KernelBuilder
from plait.codegen.tvm_script import print_tvm
from tests.util import assert_bitwise

pytestmark = pytest.mark.xdist_group("tvm-products")


def _tvm_printed(f: object) -> None:
    manifest = plait.explain(f).specializations[-1].manifest
    assert {k["printer"] for k in manifest.kernels["kernels"]} == {"tvm"}, manifest.fallbacks


def test_a_product_is_fenced_from_the_addition_it_feeds() -> None:
    kb = KernelBuilder("k", outer=(Var("i0", 8),))
    a, b, out = kb.buffer("a", "f32", 8), kb.buffer("b", "f32", 8), kb.buffer("o", "f32", 8, True)
    i = Ix.var(kb.outer[0])
    x, y = kb.load(a, i), kb.load(b, i)
    kb.store(out, i, kb.op("add", [kb.op("mul", [x, y], "f32"), y], "f32"))
    text = print_tvm(kb.build(nodes=()), "k").source
    assert text.count('"llvm.arithmetic.fence"') == 1, text


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_multiply_then_add_is_bitwise_eager(dtype: torch.dtype) -> None:
    def fn(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (x * y + z) / (y.abs() + 1) - x * 1.7

    f = plait.compile(fn, backend="tvm")
    gen = torch.Generator().manual_seed(31)
    for _ in range(2):
        args = [(torch.randn(6, 67, generator=gen) * 3).to(dtype) for _ in range(3)]
        assert_bitwise(f(*args), fn(*args), str(dtype))
    _tvm_printed(f)

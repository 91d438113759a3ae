"""Narrow integers in Triton kernels, through Triton's interpreter on CPU tensors: float to int8
and int16 casts, and integer scalars outside their tensor's dtype, equal eager's exactly.

- PyTorch casts a float to int8 and int16 through a 32-bit conversion on both devices (a CPU's
  gives the lowest int32 out of range, a GPU's saturates), then keeps the low bits; uint8 and
  int64 go through 64 bits. The kernels took int8 and int16 through 64 bits: an int16 of 3e10 was
  -20480 where eager gives 0 on the CPU and -1 on a GPU.
- A Python integer combined with an integer tensor takes the tensor's dtype, wrapping as a C cast
  does (``int8 + 300`` adds 44, ``uint8 // 300`` divides by 44, ``uint8 == 256`` compares with
  0). The kernels printed the unwrapped constant, which ``tl.full`` refuses: the compile failed
  (interpreted) or depended on Triton's conversion of an out-of-range literal (compiled).

Integers are exact under the contract: the comparison is ``torch.equal``.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing, this fails rather than skips)

import plait

TRITON = {"cache": False, "stax": {"target": "triton"}}
SOURCES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
NARROW = (torch.int8, torch.int16, torch.uint8)


@pytest.fixture(autouse=True)
def _private_cache(stax_cache: Path) -> None:
    """Kernel modules go to the session's cache, never the user's."""


def _compiled(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    compiled = plait.compile(fn, backend="stax", fullgraph=True, options=TRITON)
    return compiled


def _assert_equal(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> None:
    compiled = _compiled(fn)
    with torch.no_grad():
        expected = fn(*(x.clone() for x in inputs))
        got = compiled(*(x.clone() for x in inputs))
    assert expected.dtype == got.dtype and expected.shape == got.shape
    bad = (expected != got).nonzero().flatten()
    assert bad.numel() == 0, [
        ([x[i].item() for x in inputs], expected[i].item(), got[i].item()) for i in bad[:4]
    ]
    spec = compiled.specializations[-1]  # type: ignore[attr-defined]
    assert spec.manifest.executor["target"] == "triton"
    assert spec.manifest.executor["evidence"]["counts"]["fallback"] == 0


def _values(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Values of every magnitude up to 1e30 (past int32's and int64's ranges), both signs, with
    NaN and infinities among them."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.pow(10.0, torch.rand(256, generator=gen, dtype=torch.float64) * 30)
    sign = torch.where(torch.rand(256, generator=gen) < 0.5, -1.0, 1.0).double()
    x = magnitude * sign + torch.rand(256, generator=gen, dtype=torch.float64)
    x[:6] = torch.tensor([3e10, -3e10, 2.5e9, -2.5e9, 70000.0, -40000.0], dtype=torch.float64)
    x[torch.randperm(256, generator=gen)[:24]] = torch.tensor(
        [float("nan"), float("inf"), float("-inf")], dtype=torch.float64
    ).repeat(8)
    return x.to(dtype)


@pytest.mark.parametrize("source", SOURCES, ids=str)
@pytest.mark.parametrize("target", NARROW, ids=str)
def test_float_to_narrow_integer_matches_eager(source: torch.dtype, target: torch.dtype) -> None:
    for seed in range(2):
        _assert_equal(lambda x: (x * 1).to(target), _values(seed, source))


def _ints(dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, (64,), generator=gen)
    x[:4] = torch.tensor([info.min, info.max, 0, 1])
    return x.to(dtype)


# NOTE: name -> (dtype, program): each program reads a Python integer its dtype cannot hold
OUT_OF_RANGE = {
    "int8_add_300": (torch.int8, lambda x: x + 300),
    "int8_sub_minus_200": (torch.int8, lambda x: x - (-200)),
    "int8_mul_2_63": (torch.int8, lambda x: x * 2**63),
    "int16_mul_70000": (torch.int16, lambda x: x * 70000),
    "int32_add_2_40": (torch.int32, lambda x: x + 2**40),
    "uint8_add_minus_3": (torch.uint8, lambda x: x + (-3)),
    "uint8_mul_1000": (torch.uint8, lambda x: x * 1000),
    "uint8_floordiv_300": (torch.uint8, lambda x: x // 300),
    "uint8_eq_256": (torch.uint8, lambda x: x == 256),
    "uint8_lt_minus_1": (torch.uint8, lambda x: x < -1),
    "int8_gt_200": (torch.int8, lambda x: x > 200),
}


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_integer_scalar_out_of_the_dtypes_range_wraps_as_eager(name: str) -> None:
    dtype, fn = OUT_OF_RANGE[name]
    _assert_equal(fn, _ints(dtype))

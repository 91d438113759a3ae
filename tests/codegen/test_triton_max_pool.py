"""Max-pooling as a Triton kernel (codegen.lower.native_max_pool), run through Triton's
interpreter: bit for bit ATen's ``max_pool2d`` (a maximum rounds nothing) on fresh random inputs
with NaN and infinities planted, for windows, strides, paddings and dilations; the producer's
pointwise ops are computed in the pooling kernel."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # NOTE: before triton is imported (its jit reads it)

import pytest
import torch
import torch.nn.functional as F

import plait
from plait.codegen.lower import native_max_pool
from plait.ir import GraphBuilder, TensorType

TRITON = {"cache": False, "stax": {"target": "triton"}}
WINDOWS = [  # kernel, stride, padding, dilation
    ((3, 3), (2, 2), (1, 1), (1, 1)),
    ((2, 2), None, (0, 0), (1, 1)),
    ((2, 3), (2, 1), (1, 0), (1, 2)),
    ((3, 1), (1, 1), (1, 0), (2, 1)),
]


def _draw(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Fresh random values with NaNs of both signs and infinities planted, and a band of
    signed zeros (ties of +0.0 and -0.0, which ATen breaks by keeping the first)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 5, 11, 12, generator=g)
    x[:, :, 4:7] *= 0.0  # NOTE: +0.0 and -0.0, by the sign of the value
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[:4]
    for pick, special in zip(picks, (float("nan"), -float("nan"), float("inf"), -float("inf"))):
        flat[pick] = special
    return x.to(dtype)


_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit: the sign of a zero and a NaN's sign count."""
    return torch.equal(got.view(_BITS[got.dtype]), want.view(_BITS[want.dtype]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", WINDOWS, ids=[str(w[0]) + str(w[3]) for w in WINDOWS])
def test_max_pool_kernel_equals_aten_bit_for_bit(window: tuple, dtype: torch.dtype) -> None:
    kernel, stride, padding, dilation = window

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(x * 2.0), kernel, stride, padding, dilation)

    compiled = plait.compile(fn, backend="stax", fullgraph=True, options=TRITON)
    for seed in (1, 2):
        x = _draw(seed, dtype)
        assert _same(compiled(x), fn(x))
    nodes = compiled.specializations[0].manifest.executor["evidence"]["nodes"]
    kernels = {n["op"]: n["detail"] for n in nodes}
    # NOTE: one kernel computes the scaled, rectified input at each window position
    assert kernels["max_pool2d"] == kernels["relu"] == kernels["mul"]
    assert kernels["max_pool2d"].startswith("kernel ")


def test_what_the_kernel_does_not_take_stays_an_aten_call() -> None:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((1, 2, 7, 7), torch.float32))
    pooled = gb.call("max_pool2d", x, kernel_size=[3, 3], stride=[2, 2], ceil_mode=True)
    plain = gb.call("max_pool2d", x, kernel_size=[3, 3], stride=[2, 2])
    gb.output(pooled, plain)
    ceil, floor = gb.build().nodes
    assert not native_max_pool(ceil) and native_max_pool(floor)

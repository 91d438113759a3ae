"""On CUDA, as on the CPU, an extern's result keeps the layout PyTorch gives it without
channels_last: attention over q, k and v split from one projection returns its output in the
projection's (B, T, H, D) order, and a plan that conformed it to contiguous strides would copy it
on every call (what CUDA programs without channels_last did; training programs are planned
without it). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from plait.codegen.fusion import plan_graph
from plait.codegen.plan import ExternStep, KernelStep
from plait.ir import Graph, GraphBuilder, TensorType
from plait.runtime import StaxOptions, compile_graph
from tests.util import assert_bitwise

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

B, T, H, D = 2, 128, 4, 64
DTYPE = torch.bfloat16


def _heads(proj: torch.Tensor) -> list[torch.Tensor]:
    return [p.reshape(B, T, H, D).permute(0, 2, 1, 3) for p in proj.split(H * D, dim=2)]


def _graph() -> Graph:
    gb = GraphBuilder()
    proj = gb.input("proj", TensorType((B, T, 3 * H * D), DTYPE, "cuda:0"))
    heads = []
    for part in gb.call("split", proj, sizes=(H * D,) * 3, dim=2):
        split = gb.call("reshape", part, shape=(B, T, H, D))
        heads.append(gb.call("permute", split, dims=(0, 2, 1, 3)))
    gb.output(gb.call("scaled_dot_product_attention", *heads, is_causal=True))
    return gb.build()


def _eager(proj: torch.Tensor) -> torch.Tensor:
    q, k, v = _heads(proj)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _eager_strides() -> tuple[int, ...]:
    out = _eager(torch.randn(B, T, 3 * H * D, dtype=DTYPE, device="cuda"))
    assert not out.is_contiguous()  # NOTE: else this test would show nothing
    return tuple(out.stride())


def test_attention_result_keeps_pytorchs_layout_on_cuda() -> None:
    plan = plan_graph(_graph(), channels_last=False, target="triton")
    (step,) = [s for s in plan.steps if isinstance(s, ExternStep)]
    assert tuple(step.out_strides[0]) == _eager_strides()
    assert not [s for s in plan.steps if isinstance(s, KernelStep)]  # NOTE: no conforming copy


def test_the_cuda_program_gives_eagers_values() -> None:
    prog = compile_graph(_graph(), options=StaxOptions(channels_last=False))
    assert not [s for s in prog.plan.steps if isinstance(s, KernelStep)]
    for seed in (0, 1):
        g = torch.Generator(device="cuda").manual_seed(seed)
        proj = torch.randn(B, T, 3 * H * D, dtype=DTYPE, device="cuda", generator=g)
        (got,) = prog(proj)
        assert_bitwise(got, _eager(proj), "attention")  # NOTE: eager's own kernel

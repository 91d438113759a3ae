"""An extern's result keeps the layout PyTorch gives it, with or without channels_last: ATen's
CPU flash attention over q, k and v split from one projection returns its output and
log-sum-exp transposed, and a plan that conformed them to contiguous strides would copy both
on every call (what training programs, planned without channels_last, did)."""

from __future__ import annotations

import json

import pytest
import torch

from plait.codegen.fusion import plan_graph
from plait.codegen.plan import ExternStep, KernelStep
from plait.ir import GraphBuilder, TensorType, interpret
from plait.runtime import StaxOptions, compile_graph
from tests.util import assert_bitwise

B, T, H, D = 2, 16, 2, 8
FLASH = "_scaled_dot_product_flash_attention_for_cpu"


def _attention() -> tuple[GraphBuilder, list[object]]:
    gb = GraphBuilder()
    proj = gb.input("proj", TensorType((B, T, 3 * H * D), torch.float32))
    heads = []
    for part in gb.call("split", proj, sizes=(H * D,) * 3, dim=2):
        split = gb.call("reshape", part, shape=(B, T, H, D))
        heads.append(gb.call("permute", split, dims=(0, 2, 1, 3)))
    literals = json.dumps([{"t": 0}, {"t": 1}, {"t": 2}, 0.0, True])
    out = gb.call("aten", heads, name=FLASH, overload="default", literals=literals,
                  kwliterals=json.dumps({}))  # fmt: skip
    gb.output(*out)
    return gb, heads


def _eager_strides() -> list[tuple[int, ...]]:
    proj = torch.randn(B, T, 3 * H * D)
    q, k, v = (p.reshape(B, T, H, D).permute(0, 2, 1, 3) for p in proj.split(H * D, dim=2))
    return [tuple(r.stride()) for r in getattr(torch.ops.aten, FLASH)(q, k, v, 0.0, True)]


@pytest.mark.parametrize("channels_last", [True, False])
def test_flash_attention_results_keep_pytorchs_layout(channels_last: bool) -> None:
    gb, _ = _attention()
    plan = plan_graph(gb.build(), channels_last=channels_last)
    (step,) = [s for s in plan.steps if isinstance(s, ExternStep)]
    assert [tuple(s) for s in step.out_strides] == _eager_strides()
    assert not [s for s in plan.steps if isinstance(s, KernelStep)]  # NOTE: q, k, v: views


def test_the_program_gives_eagers_values_in_eagers_layout() -> None:
    gb, _ = _attention()
    g = gb.build()
    prog = compile_graph(g, options=StaxOptions(channels_last=False))
    for seed in (0, 1):
        proj = torch.randn(B, T, 3 * H * D, generator=torch.Generator().manual_seed(seed))
        got, want = prog(proj), interpret(g, [proj])
        for a, b in zip(got, want):
            assert_bitwise(a, b, "flash attention")  # NOTE: eager's own kernel
        assert [tuple(a.stride()) for a in got] == _eager_strides()

"""Which strided views a CUDA matrix product's operand is copied out of by a kernel first
(:func:`plait.codegen.cuda_extern.copies_operand`), planned without a GPU."""

from __future__ import annotations

import pytest
import torch

from plait.codegen.cuda_extern import flattens
from plait.codegen.fusion import plan_graph
from plait.codegen.plan import ExternStep, KernelStep
from plait.ir import GraphBuilder, TensorType


def _plan(op: str, dims: list[int], w_shape: tuple[int, ...], device: str = "cuda") -> list[str]:
    gb = GraphBuilder()
    x = gb.input("x", TensorType((4, 6, 8), torch.float32, device=device))
    w = gb.input("w", TensorType(w_shape, torch.float32, device=device))
    gb.output(gb.call(op, gb.call("permute", x, dims=dims), w))
    target = "triton" if device == "cuda" else "cpu"
    plan = plan_graph(gb.build(), target=target, infer_layouts=False, onednn=False)
    return [type(s).__name__ for s in plan.steps]


def test_a_transposed_batch_operand_is_written_contiguous_by_a_kernel() -> None:
    # NOTE: (6, 4, 8) with strides (8, 48, 1): no view flattens it to (24, 8)
    assert _plan("linear", [1, 0, 2], (16, 8)) == [KernelStep.__name__, ExternStep.__name__]
    assert _plan("matmul", [1, 0, 2], (8, 16)) == [KernelStep.__name__, ExternStep.__name__]


def test_views_cublas_reads_in_place_are_left_alone() -> None:
    # NOTE: the identity permutation flattens; a batched matmul by a batch reads any strides;
    # the CPU plans as before
    assert _plan("linear", [0, 1, 2], (16, 8)) == [ExternStep.__name__]
    assert _plan("matmul", [1, 0, 2], (6, 8, 16)) == [ExternStep.__name__]
    assert _plan("linear", [1, 0, 2], (16, 8), device="cpu") == [ExternStep.__name__]


@pytest.mark.parametrize("dims", [(0, 1, 2), (1, 0, 2), (0, 2, 1), (2, 1, 0)])
def test_flattens_agrees_with_torch_view(dims: tuple[int, ...]) -> None:
    t = torch.empty(3, 5, 7).permute(*dims)
    try:
        t.view(-1, t.shape[-1])
        viewable = t.stride(-1) == 1
    except RuntimeError:
        viewable = False
    assert flattens(tuple(t.shape), t.stride()) == viewable

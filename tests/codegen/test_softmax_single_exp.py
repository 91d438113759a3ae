"""The C++ softmax computes exp once per element: it stores exp(x - max) with the sum's phase
and divides the output in place, where the output holds float32 exactly (else, and for the
TVM and Triton printers, the last phase computes exp again). The gate judges it at shapes
where a row is one element, a whole tensor, or strided."""

from __future__ import annotations

import pytest
import torch

import plait
from plait.codegen.index import contiguous_strides
from plait.codegen.placement import Loc
from plait.codegen.reductions import lower_reduction
from plait.ir import GraphBuilder, TensorType
from tests.util import check_native, float_inputs


class _Softmax(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2 + 1, self.dim)


@pytest.mark.parametrize(
    ("shape", "dim"),
    [
        ((64, 1024), -1),
        ((1, 70001), -1),
        ((7, 33, 5), 1),
        ((2, 3, 4, 5), 0),
        ((7, 1), -1),
        ((1,), 0),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_passes_the_gate(shape: tuple[int, ...], dim: int, dtype: torch.dtype) -> None:
    check_native(_Softmax(dim), float_inputs(shape, dtype))


def _exps(compiled: object) -> int:
    program = compiled.specializations[-1].compiled.program  # type: ignore[attr-defined]
    return sum(k.source.count("expf(") for k in program.kernels)


@pytest.mark.parametrize(("dtype", "exps"), [(torch.float32, 1), (torch.bfloat16, 2)])
def test_float32_softmax_computes_exp_once(dtype: torch.dtype, exps: int) -> None:
    compiled = plait.compile(_Softmax(-1), options={"cache": False})
    with torch.no_grad():
        compiled(torch.randn(8, 100).to(dtype))
    assert _exps(compiled) == exps


def test_tvm_prints_its_own_softmax_and_refuses_a_rereading_kernel() -> None:
    pytest.importorskip("tvm")
    from plait.codegen.tvm_script import Unsupported, print_tvm

    compiled = plait.compile(_Softmax(1), backend="tvm", options={"cache": False})
    with torch.no_grad():
        compiled(torch.randn(7, 33, 5))
    evidence = compiled.specializations[-1].manifest.executor["evidence"]["nodes"]
    softmax = next(n for n in evidence if n["op"] == "softmax")
    assert "[TVM]" in softmax["detail"], softmax
    # NOTE: TVM's blocks are not ordered for a phase that reads what an earlier one stored
    gb = GraphBuilder()
    x = gb.input("x", TensorType((7, 33, 5), torch.float32))
    gb.output(gb.call("softmax", x, dim=1))
    g = gb.build()
    x_value = g.nodes[0].inputs[0]
    locs = {x_value: Loc("buffer", x_value, 0, contiguous_strides((7, 33, 5)))}
    kernel = lower_reduction("k0", g.nodes[0], locs, reread=True).kernel
    with pytest.raises(Unsupported, match="reads back"):
        print_tvm(kernel, "k0")

"""Float32 products timed at compile time (``plait.codegen.timed_matmul``): oneDNN's matmul
computes what PyTorch's does within the contract's matmul budget on fresh inputs in every layout a
training program hands it; the plan keeps whichever timed faster, records a refusal with both
times otherwise, and a saved plan replays the choice without timing anything."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plait.codegen import timed_matmul
from plait.codegen.fusion import extern_layouts, plan_graph
from plait.codegen.plan import STAGES, ExternStep
from plait.ir import GraphBuilder, TensorType, interpret
from plait.runtime import StaxOptions, compile_graph
from tests.util import contract_tol

F32 = torch.float32
pytestmark = pytest.mark.skipif(
    not timed_matmul.strict_float32() or not torch.backends.mkldnn.is_available(),
    reason="no strict float32 oneDNN matmul here",
)


def _product(op: str, sx: tuple[int, ...], sw: tuple[int, ...], bias: bool = False) -> Any:
    gb = GraphBuilder()
    x, w = gb.input("x", TensorType(sx, F32)), gb.input("w", TensorType(sw, F32))
    extra = [gb.input("b", TensorType((sw[0],), F32))] if bias else []
    gb.output(gb.call(op, x, w, *extra))
    return gb.build()


def _fresh(shape: tuple[int, ...], seed: int, transposed: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if transposed and len(shape) == 2:  # NOTE: the layout of a backward's g^T or W^T
        return torch.randn(shape[::-1], generator=gen).t()
    return torch.randn(shape, generator=gen)


CASES = [
    ("matmul", (24, 16), (16, 8), False),
    ("matmul", (2, 12, 16), (16, 8), False),
    ("linear", (2, 12, 16), (8, 16), True),
    ("linear", (12, 16), (8, 16), False),
]


@pytest.mark.parametrize("op,sx,sw,bias", CASES)
@pytest.mark.parametrize("transposed", [False, True])
def test_onednn_products_are_pytorchs_within_the_contract(
    op: str, sx: tuple[int, ...], sw: tuple[int, ...], bias: bool, transposed: bool
) -> None:
    g = _product(op, sx, sw, bias)
    (node,) = g.nodes
    assert timed_matmul.eligible(node)
    fn = timed_matmul.onednn_call(node).fn
    for seed in (0, 1):
        args = [_fresh(sx, seed, transposed), _fresh(sw, seed + 10, transposed)]
        args += [_fresh((sw[0],), seed + 20, False)] if bias else []
        got, (want,) = fn(*args), interpret(g, args)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, **contract_tol("matmul", F32))


def _extern(plan: Any) -> ExternStep:
    (step,) = [s for s in plan.steps if isinstance(s, ExternStep)]
    return step


@pytest.mark.parametrize("faster", ["oneDNN", "PyTorch"])
def test_the_plan_keeps_the_faster_and_replays_it(
    faster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = _product("matmul", (64, 32), (32, 48))
    times = (1e-6, 2e-6) if faster == "oneDNN" else (2e-6, 1e-6)
    monkeypatch.setattr(timed_matmul, "timings", lambda *a: times)
    plan = plan_graph(g, timed_matmul=True, onednn=False, channels_last=False)
    step = _extern(plan)
    assert (step.call.library == timed_matmul.LIBRARY) is (faster == "oneDNN")
    refused = plan.refused.get(0, {}).get(timed_matmul.STAGE)
    assert (refused is None) is (faster == "oneDNN")
    if refused is not None:
        assert "2 us" in refused and "1 us" in refused  # NOTE: both times, as measured
    saved = extern_layouts(plan)
    assert timed_matmul.STAGE in STAGES  # NOTE: a saved program's decisions are checked by it

    def untimed(*a: Any) -> Any:
        raise AssertionError("a saved plan timed a product")

    monkeypatch.setattr(timed_matmul, "timings", untimed)
    replayed = plan_graph(g, layouts=saved, timed_matmul=True, onednn=False, channels_last=False)
    assert _extern(replayed).call.detail == step.call.detail


@pytest.mark.parametrize("timed", [True, False])
def test_programs_compute_eagers_products(timed: bool) -> None:
    g = _product("linear", (4, 32, 64), (96, 64), bias=True)
    prog = compile_graph(g, options=StaxOptions(timed_matmul=timed, onednn=False))
    detail = _extern(prog.plan).call.detail
    assert timed or detail == "aten.linear"
    for seed in (0, 1):
        args = [_fresh((4, 32, 64), seed, False), _fresh((96, 64), seed + 1, False)]
        args.append(_fresh((96,), seed + 2, False))
        (got,), (want,) = prog(*args), interpret(g, args)
        torch.testing.assert_close(got, want, **contract_tol("matmul", F32))

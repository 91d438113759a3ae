"""A float32 linear of at most ``MAX_LINEAR_ROWS`` rows (a classifier's head at batch 1, a
decoder's step) runs plait's native 1x1 kernel (``plait.codegen.pointwise_native``) on a CPU with
AVX-512, its weight blocked at compile time, the residual add and activation after it folded
in, and answers as eager: within the contract's matmul budget on fresh inputs (one row, rows
over several leading dims, a rank-1 input, sizes that are no multiple of 16, more than 64
outputs), NaN and infinities where eager has them, a weight written in place read again, the
same bits at two threads as at one. A linear of more rows stays oneDNN's or MKL's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.codegen.pointwise_native import MAX_LINEAR_ROWS, available
from tests.codegen.native_conv_helpers import node_details, special_values_match
from tests.util import assert_bitwise, contract_tol, torch_threads

pytestmark = [
    pytest.mark.usefixtures("stax_cache"),
    pytest.mark.skipif(not available(), reason="the native kernel needs AVX-512"),
]
NATIVE = "native linear of"
ACTS = {"none": lambda v: v, "relu": F.relu, "hardswish": F.hardswish, "silu": F.silu}


class Head(nn.Module):
    """A linear, then (``residual``) a same-shaped input added, then an activation."""

    def __init__(self, cin: int, cout: int, act: str, residual: bool, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(cin, cout, bias=bias)
        self.act, self.residual = ACTS[act], residual

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return self.act(y + r if self.residual else y)


def _natives(compiled: Any) -> list[str]:
    return [d for d in node_details(compiled).values() if d.startswith(NATIVE)]


def _check(model: nn.Module, shapes: list[tuple[int, ...]], seed: int) -> Any:
    model.eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(3):
            args = [torch.randn(s, generator=gen) * 3 for s in shapes]
            torch.testing.assert_close(
                compiled(*args), model(*args), **contract_tol("matmul", torch.float32)
            )
    return compiled


# NOTE: (leading sizes, in, out): one row, rows over two leading dims, a rank-1 input, the most
# rows; sizes that are no multiple of 16 and more than 64 outputs (several weight blocks)
CASES = [((1,), 96, 130), ((2, 3), 40, 33), ((), 17, 70), ((MAX_LINEAR_ROWS,), 160, 200)]


@pytest.mark.parametrize("lead,cin,cout", CASES)
@pytest.mark.parametrize("act,residual", [("none", False), ("relu", True), ("hardswish", False)])
def test_few_rows_match_eager_with_the_epilogue_folded(
    lead: tuple[int, ...], cin: int, cout: int, act: str, residual: bool
) -> None:
    torch.manual_seed(cin + cout)
    model = Head(cin, cout, act, residual)
    compiled = _check(model, [(*lead, cin), (*lead, cout)], seed=cin)
    (native,) = _natives(compiled)
    folded = [d for d in node_details(compiled).values() if d.startswith("folded into")]
    assert len(folded) == int(residual) + int(act != "none"), native
    assert all("native linear call" in d for d in folded), folded


def test_more_rows_stay_the_librarys() -> None:
    torch.manual_seed(1)
    compiled = _check(Head(32, 48, "none", False), [(MAX_LINEAR_ROWS + 1, 32), (1,)], seed=2)
    assert _natives(compiled) == [], node_details(compiled)


def test_no_bias_matches_eager() -> None:
    torch.manual_seed(3)
    compiled = _check(Head(64, 80, "silu", False, bias=False), [(2, 64), (1,)], seed=4)
    assert len(_natives(compiled)) == 1


@pytest.mark.parametrize("act", ["relu", "hardswish"])
def test_nan_and_infinities_match_eager(act: str) -> None:
    torch.manual_seed(5)
    model = Head(48, 72, act, residual=True).eval()
    compiled = special_values_match(model, [(4, 48), (4, 72)], "matmul", f"linear+{act}", 6)
    assert len(_natives(compiled)) == 1


def test_weight_written_in_place_is_read_again() -> None:
    torch.manual_seed(7)
    model = Head(40, 56, "none", residual=False).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        x, r = torch.randn(1, 40, generator=gen), torch.randn(1, generator=gen)
        compiled(x, r)
        model.fc.weight.mul_(torch.rand(model.fc.weight.shape, generator=gen) + 0.5)
        got, want = compiled(x, r), model(x, r)
        torch.testing.assert_close(got, want, **contract_tol("matmul", torch.float32))
    assert len(_natives(compiled)) == 1


def test_two_threads_match_one() -> None:
    """One row split over threads by blocks of output channels: each output is one thread's
    sum, so the bits are one thread's."""
    torch.manual_seed(9)
    model = Head(960, 1280, "hardswish", residual=False).eval()
    compiled = plait.compile(model, backend="stax")
    gen = torch.Generator().manual_seed(10)
    x, r = torch.randn(1, 960, generator=gen), torch.randn(1, generator=gen)
    with torch.no_grad():
        with torch_threads(1):
            one = compiled(x, r)
        with torch_threads(2):
            two = compiled(x, r)
        torch.testing.assert_close(one, model(x, r), **contract_tol("matmul", torch.float32))
    assert_bitwise(two, one, "two threads against one")
    assert len(_natives(compiled)) == 1

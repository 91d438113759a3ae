"""A float32 linear without post-ops runs MKL's packed GEMM: the weight packed once for the call's
rows. Invariants: it answers as eager does on fresh inputs (in the contract's matmul tolerance);
a cache entry never carries its packed bytes (MKL's own format for this CPU, no descriptor), so a
warm start packs again and says so; a weight updated in place is packed again, never stale."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.codegen.onednn_postops import mkl_linear_available
from plait.contract import load
from tests.cache.helpers import status

pytestmark = pytest.mark.skipif(
    not mkl_linear_available(),
    reason="this PyTorch build has no MKL packed linear",
)

MKL = "MKL packed linear"
# NOTE: MKL's packed GEMM as such, not whichever library times faster on this host
# (tests/codegen/test_timed_linear.py checks that choice)
UNTIMED = {"timed_matmul": False}


class Mlp(nn.Module):
    """Linears on a 3-d activation: one followed by relu, one with no bias followed by silu (a
    oneDNN post-op when linears run oneDNN), one last with nothing after it."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(24, 64)
        self.mid = nn.Linear(64, 48, bias=False)
        self.down = nn.Linear(48, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.mid(self.up(x).relu())))


def _model(seed: int = 0) -> Mlp:
    torch.manual_seed(seed)
    return Mlp().eval()


def _inputs(seeds: range) -> list[torch.Tensor]:
    return [torch.randn(3, 10, 24, generator=torch.Generator().manual_seed(s)) for s in seeds]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = load().tolerance("matmul", torch.float32)
    torch.testing.assert_close(actual, expected, rtol=tol.rtol, atol=tol.atol)


def _details(spec: Any) -> list[str]:
    return [t.detail for t in spec.compiled.program.evidence.nodes.values()]


def _run(model: nn.Module, xs: list[torch.Tensor], **opts: Any) -> tuple[list[Any], Any]:
    compiled = plait.compile(model, options=opts)
    with torch.no_grad():
        outs = [compiled(x) for x in xs]
    return outs, compiled.specializations[-1]


def test_each_linear_runs_mkl_packed_and_answers_as_eager() -> None:
    model = _model()
    xs = _inputs(range(100, 104))
    outs, spec = _run(model, xs, cache=False, stax=UNTIMED)
    mkl = [d for d in _details(spec) if d.startswith(MKL)]
    assert len(mkl) == 3 and all("prepacked at compile time" in d for d in mkl), mkl
    assert not any("fused" in d for d in mkl), mkl  # NOTE: silu is a native kernel
    with torch.no_grad():
        for x, y in zip(xs, outs):
            _close(y, model(x))


def test_a_cache_entry_carries_no_mkl_pack_and_a_warm_start_packs_again(tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    _, cold = _run(_model(), _inputs(range(1)), cache=cache, stax=UNTIMED)
    assert status(cold) == "miss"
    assert not [k for k in cold.compiled.program.prepacked() if ":mkl:" in k]
    model, xs = _model(), _inputs(range(200, 203))
    outs, warm = _run(model, xs, cache=cache, stax=UNTIMED)
    assert status(warm) == "hit"
    mkl = [d for d in _details(warm) if d.startswith(MKL)]
    assert len(mkl) == 3 and all("at load, in the background" in d for d in mkl), mkl
    with torch.no_grad():
        for x, y in zip(xs, outs):
            _close(y, model(x))


def test_a_weight_updated_in_place_is_packed_again() -> None:
    model, xs = _model(), _inputs(range(300, 302))
    compiled = plait.compile(model, options={"cache": False, "freeze": False, "stax": UNTIMED})
    with torch.no_grad():
        _close(compiled(xs[0]), model(xs[0]))
        model.mid.weight.mul_(-1.5).add_(0.25)  # NOTE: the same tensor, a new version
        _close(compiled(xs[1]), model(xs[1]))
        model.up.weight = nn.Parameter(torch.randn_like(model.up.weight))  # NOTE: a new tensor
        _close(compiled(xs[0]), model(xs[0]))
    assert [d for d in _details(compiled.specializations[-1]) if d.startswith(MKL)]


def test_with_mkl_linear_off_linears_run_onednn_with_the_activation_fused() -> None:
    model, xs = _model(), _inputs(range(400, 402))
    outs, spec = _run(model, xs, cache=False, stax={"mkl_linear": False})
    details = _details(spec)
    assert not [d for d in details if d.startswith(MKL)], details
    linears = [d for d in details if d.startswith("oneDNN linear")]
    assert len(linears) == 3 and sum("fused swish" in d for d in linears) == 1, linears
    with torch.no_grad():
        for x, y in zip(xs, outs):
            _close(y, model(x))

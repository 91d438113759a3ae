"""A representative slice of PyTorch's OpInfo samples through plait.compile: no silent mismatch.

The full sweep is ``make coverage`` (benchmarks/opinfo_coverage.py, table in docs/coverage.md).
This slice takes the first samples of a few ops of every family (pointwise, NaN-sensitive
pointwise, reductions, structseq-returning ops, data movement, matmul, convolution,
normalization, attention, random ops, programs that fall back) and runs each in both grad modes,
each sample called three times beside eager: its own values, a fresh draw of the same shapes (a
result kept from the capture fails there), and that draw with NaN, ±inf and -0.0 written in. It
fails on any silent mismatch: a result unlike eager's under the numerical contract, or a zero of
the other sign, with no error.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import plait.contract
from benchmarks import opinfo_sweep

SAMPLES_PER_OP = 3

FAMILIES: dict[str, tuple[str, ...]] = {
    "pointwise": ("abs", "neg", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "sin", "add",
                  "mul", "sub", "div.no_rounding_mode", "pow", "where", "erf"),
    "nan_sensitive": ("nn.functional.relu", "clamp", "clamp_min", "clamp_max", "maximum",
                      "minimum", "fmax", "nn.functional.hardtanh", "nn.functional.silu"),
    "reduction": ("sum", "mean", "amax", "amin", "argmax", "prod", "var", "cumsum", "logsumexp"),
    "structseq": ("sort", "topk", "max.reduction_with_dim", "aminmax", "kthvalue", "cummax"),
    "data_movement": ("cat", "stack", "reshape", "permute", "transpose", "expand", "gather",
                      "index_select", "flip", "narrow", "squeeze", "unsqueeze", "view", "t"),
    "matmul": ("mm", "matmul", "bmm", "addmm", "nn.functional.linear"),
    "conv": ("nn.functional.conv2d",),
    "normalization": ("softmax", "log_softmax", "nn.functional.layer_norm",
                      "nn.functional.batch_norm", "nn.functional.group_norm"),
    "attention": ("nn.functional.scaled_dot_product_attention",),
    "random": ("randn", "nn.functional.dropout", "empty_like"),
    "fallback": ("nonzero", "masked_select", "item"),
    # NOTE: calls with no capture rule traced to ATen: one typed aten node (lgamma, svd's three
    # results, cdist), a composite of native and aten nodes (poisson_nll_loss), an aten factory
    # (logspace), a call that was a whole-program fallback (max_pool1d's tuple arguments), one
    # refused for a data-dependent check (gaussian_nll_loss stays opaque)
    "aten": ("lgamma", "linalg.svd", "cdist", "nn.functional.poisson_nll_loss", "logspace",
             "nn.functional.max_pool1d", "nn.functional.gaussian_nll_loss"),
}  # fmt: skip

SLICE = [key for keys in FAMILIES.values() for key in keys]


@functools.cache
def _ops() -> dict[str, Any]:
    return {opinfo_sweep.op_key(op): op for op in opinfo_sweep.float32_ops()}


def _param(key: str) -> Any:
    return pytest.param(key, marks=[pytest.mark.slow], id=key)


def test_slice_names_existing_ops_of_every_family() -> None:
    ops = _ops()
    missing = [key for key in SLICE if key not in ops]
    assert not missing, f"not in this torch's op_db: {missing}"
    classes = {opinfo_sweep.op_class(ops[key]) for key in SLICE}
    assert {"pointwise", "reduction", "data_movement", "matmul", "conv", "normalization"} <= classes
    assert any(opinfo_sweep.is_random(ops[key]) for key in SLICE)


@pytest.mark.parametrize("key", [_param(key) for key in SLICE])
def test_no_silent_mismatch(key: str) -> None:
    outcomes = list(
        opinfo_sweep.run_op(_ops()[key], limit=SAMPLES_PER_OP, grad_modes=opinfo_sweep.GRAD_MODES)
    )
    assert outcomes, f"{key}: no samples"
    judged = [o for o in outcomes if o.category != "not_judged"]
    assert judged, f"{key}: eager rejected every sample: {outcomes[0].detail}"
    # NOTE: a zero of the other sign is a different result too (1/x, atan2, copysign see it),
    # though the contract's elementwise rule cannot tell them apart.
    wrong = [o for o in outcomes if o.category in ("mismatch", "signed_zero")]
    assert not wrong, "\n".join(
        f"{o.op} sample {o.index} ({o.desc}), {o.grad_mode}, {o.draw}: {o.detail}" for o in wrong
    )


# NOTE: these pass every sample with no opaque node and no whole-program fallback, every
# sample running typed ATen extern nodes (True), or some of them (None: poisson_nll_loss is
# plait's own IR ops but for full=True's masked_fill)
ATEN_PASSING = {
    "lgamma": True,
    "linalg.svd": True,
    "cdist": True,
    "nn.functional.poisson_nll_loss": None,
}


@pytest.mark.parametrize("key", [_param(key) for key in ATEN_PASSING])
def test_aten_traced_ops_run_with_no_fallback(key: str) -> None:
    outcomes = list(opinfo_sweep.run_op(_ops()[key], limit=SAMPLES_PER_OP, grad_modes=("no_grad",)))
    judged = [o for o in outcomes if o.category != "not_judged"]
    assert judged and all(o.category == "pass" for o in judged), [
        (o.category, o.detail) for o in judged
    ]
    if ATEN_PASSING[key] is not None:
        assert all(bool(o.externs) == ATEN_PASSING[key] for o in judged), [
            o.externs for o in judged
        ]


def test_the_judge_catches_each_kind_of_difference() -> None:
    """The slice can fail: values, NaN positions, signed zeros, result types, stale subclasses."""
    op = _ops()["sort"]
    judge = opinfo_sweep.judge_for(op)
    tol = plait.contract.load().tolerance(opinfo_sweep.op_class(op), torch.float32)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))
    eager = torch.sort(x, dim=1)
    assert judge(eager, torch.sort(x.clone(), dim=1)) is None

    def kind(verdict: tuple[str, str] | None) -> str | None:
        return None if verdict is None else verdict[0]

    nan = x.clone()
    nan[0, 0] = float("nan")
    assert kind(judge(torch.sort(nan, dim=1), torch.sort(nan.nan_to_num(), dim=1))) == "mismatch"
    assert kind(judge(eager, tuple(eager))) == "mismatch"  # a plain tuple for a structseq
    # NOTE: ten times the contract's budget for this op's class, at every element
    budget = tol.atol * max(1.0, float(eager.values.abs().max())) + tol.rtol * eager.values.abs()
    off = torch.return_types.sort((eager.values + 10 * budget, eager.indices))
    assert kind(judge(eager, off)) == "mismatch"

    class Stale(torch.Tensor):
        pass

    stale = torch.return_types.sort((eager.values.as_subclass(Stale), eager.indices))
    assert kind(judge(eager, stale)) == "mismatch"
    zeros = torch.tensor([0.0, -0.0])
    assert kind(judge(zeros, zeros.abs())) == "signed_zero"

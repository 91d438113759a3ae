"""Ill-conditioned values (contract 1.2.0; the stress draw since 1.3.0): where eager itself is
outside the elementwise budget against float64, that budget does not judge the value against
eager; the anchored model rule does, and is not skipped as rounding noise there. Well-conditioned
values keep the elementwise check.

The case: a deep random tanh MLP in bfloat16 whose weights have gain 2 (the chaotic regime), so
it amplifies rounding: eager's logits are off float64 by ~10% in RMS, beyond the elementwise
[op.model] budget at some elements, and two correct programs differ by as much.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait.contract
from plait.conformance import Report, check
from tests.conformance.models import ConvBN, randn, seeded

WIDTH, DEPTH, GAIN = 64, 24, 2.0
MUTATED = DEPTH // 2  # NOTE: the layer a mutant gets wrong
LOGITS, HIDDEN = "output[0]", "output[1]"
ILL = "tolerance (ill-conditioned: anchored)"
STRESS = "stress draw, layout contiguous, device cpu"  # NOTE: the stress draw's anchored group


class DeepTanh(nn.Module):
    """``DEPTH`` tanh layers of random weights (std ``GAIN / sqrt(WIDTH)``) and a linear head.
    Returns the logits (ill-conditioned) and the first hidden layer (well-conditioned)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))
        self.head = nn.Linear(WIDTH, 10)
        with torch.no_grad():
            for layer in self.linears():
                nn.init.normal_(layer.weight, 0.0, GAIN / math.sqrt(WIDTH))
                nn.init.normal_(layer.bias, 0.0, 0.1)

    def linears(self) -> list[nn.Linear]:
        return [layer for layer in self.layers if isinstance(layer, nn.Linear)]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return run_layers(self, x, lambda i, layer, h: torch.tanh(layer(h)))


Step = Callable[[int, nn.Linear, torch.Tensor], torch.Tensor]


def run_layers(model: DeepTanh, x: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    h, first = x, x
    for i, layer in enumerate(model.linears()):
        h = step(i, layer, h)
        first = h if i == 0 else first
    return model.head(h), first


def bf16_model() -> DeepTanh:
    return seeded(20, DeepTanh).to(torch.bfloat16)


def example() -> tuple[torch.Tensor]:
    return (randn(16, WIDTH, seed=41, dtype=torch.bfloat16),)


def gate(model: DeepTanh, candidate: Callable[..., object], **options: Any) -> Report:
    # NOTE: without the stress and special-values draws unless asked for: the tests of them say so
    options = {"stress": None, "special_values": False, "draws": 3, **options}
    with torch.no_grad():
        return check(model, candidate, example(), candidate_module=model, **options)


def outside_budget(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Where ``actual`` is outside the contract's elementwise bfloat16 [op.model] budget around
    ``expected``."""
    tol = plait.contract.load().tolerance("model", "bfloat16")
    e, a = expected.double(), actual.double()
    scale = max(1.0, float(e.abs().max()))
    return (a - e).abs() > tol.atol * scale + tol.rtol * e.abs()


def float32_layers(model: DeepTanh) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """A correct candidate in another order: each layer computed in float32 and rounded to
    bfloat16 once (a fused kernel), where eager rounds the linear layer and the tanh apart."""

    def step(i: int, layer: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(h.float() @ layer.weight.float().T + layer.bias.float())
        return y.to(torch.bfloat16)

    def candidate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, first = x, x
        for i, layer in enumerate(model.linears()):
            h = step(i, layer, h)
            first = h if i == 0 else first
        w, b = model.head.weight.float(), model.head.bias.float()
        return (h.float() @ w.T + b).to(torch.bfloat16), first

    return candidate


def test_the_case_is_ill_conditioned_and_defeats_the_elementwise_budget() -> None:
    model = bf16_model()
    (x,) = example()
    with torch.no_grad():
        eager = model(x)
        exact = seeded(20, DeepTanh).double()(x.double())
        other = float32_layers(model)(x)
    # NOTE: eager's logits are outside the budget against float64; its first layer is not.
    assert bool(outside_budget(exact[0], eager[0]).any())
    assert not bool(outside_budget(exact[1], eager[1]).any())
    # ... and a correct program is outside it around eager: the budget cannot judge the logits.
    assert bool(outside_budget(eager[0], other[0]).any())
    assert not bool(outside_budget(eager[1], other[1]).any())


def test_a_correct_candidate_in_another_order_passes_by_the_anchored_rule() -> None:
    model = bf16_model()
    report = gate(model, float32_layers(model))
    assert report.ok, str(report)
    assert report.checks_run[ILL] == 4  # NOTE: the logits of the example and of the 3 draws
    assert f"{LOGITS} (layout contiguous, device cpu)" in report.anchored
    assert report.margins[f"{LOGITS} (layout contiguous, device cpu)"] < 1
    (note,) = [n for n in report.notes if "ill-conditioned" in n]
    assert note.startswith(f"{LOGITS} (layout contiguous, device cpu): ill-conditioned")
    assert "against float64" in note
    assert not any(n.startswith(HIDDEN) and "ill-conditioned" in n for n in report.notes)


def _transposed(i: int, layer: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    weight = layer.weight.T if i == MUTATED else layer.weight
    return torch.tanh(F.linear(h, weight, layer.bias))


def _skipped(i: int, layer: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    return h if i == MUTATED else torch.tanh(layer(h))


@pytest.mark.parametrize("step", [_transposed, _skipped], ids=["transposed", "layer_skipped"])
def test_mutants_fail_by_the_anchored_rule(step: Step) -> None:
    model = bf16_model()
    report = gate(model, lambda x: run_layers(model, x, step))
    assert report.caught(LOGITS, "anchored"), str(report)
    assert not report.caught(LOGITS, "tolerance")  # NOTE: the logits are not judged elementwise
    messages = [f.message for f in report.errors if f.check == "anchored"]
    assert any("RMS error against float64" in m for m in messages)


def test_a_well_conditioned_value_keeps_the_elementwise_check() -> None:
    model = bf16_model()
    tol = plait.contract.load().tolerance("model", "bfloat16")

    def candidate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, first = model(x)
        first = first.clone()  # NOTE: tanh: the largest magnitude S is at most 1
        first[0, 0] += 3 * (tol.atol + tol.rtol * first[0, 0].abs())
        return logits, first

    report = gate(model, candidate)
    assert report.caught(HIDDEN, "tolerance"), str(report)
    assert not report.caught(LOGITS)
    assert report.checks_run[ILL] == 4 and report.checks_run["tolerance"] >= 4


def test_a_cancelled_gradient_is_still_rounding_noise() -> None:
    # NOTE: the conv bias before a training-mode BatchNorm has gradient ~0: eager has no correct
    # bits there, yet is within the elementwise budget against float64 (its atol covers it).
    model = seeded(2, ConvBN)
    report = check(model, model, (randn(4, 3, 8, 8, seed=42),), grads=True)
    assert report.ok, str(report)
    assert report.checks_run["anchored (noise, skipped)"] >= 1
    assert report.checks_run[ILL] == 0
    assert any(n.startswith("grad[conv.bias]") and "rounding noise" in n for n in report.notes)


def test_values_without_an_anchor_keep_the_elementwise_check() -> None:
    # NOTE: a reference function over bfloat16 weights raises on float64 inputs: there is no float64
    # reference, so the logits are judged against eager elementwise, ill-conditioned or not, and a
    # correct program in another order fails that.
    model = bf16_model()
    with torch.no_grad():
        report = check(lambda x: model(x), float32_layers(model), example(), stress=None, draws=3,
                       reference_module=model, candidate_module=model)  # fmt: skip
    assert any(n.startswith("float64 anchor unavailable") for n in report.notes), str(report)
    assert report.caught(LOGITS, "tolerance")
    assert report.checks_run[ILL] == 0 and not report.anchored


def test_the_stress_draw_judges_an_ill_conditioned_value_by_the_anchored_rule() -> None:
    # NOTE: at x100 eager's logits are outside the budget against float64 as well, where a correct
    # program in another order is outside it around eager (contract 1.2.0 failed it there): the
    # stress draw has its float64 reference and its own group (its scale is not the other draws')
    model = bf16_model()
    report = gate(model, float32_layers(model), stress=100.0)
    assert report.ok, str(report)
    assert report.checks_run[ILL] == 5  # NOTE: the example, 3 draws and the stress draw
    stress = f"{LOGITS} ({STRESS})"
    assert report.anchored[stress].draws == 1 and report.margins[stress] < 1
    assert any(n.startswith(stress) and "ill-conditioned" in n for n in report.notes)
    # NOTE: the first layer is well-conditioned there too: the elementwise check alone judges it
    assert f"{HIDDEN} ({STRESS})" not in report.anchored


@pytest.mark.parametrize("step", [_transposed, _skipped], ids=["transposed", "layer_skipped"])
def test_mutants_fail_the_stress_draw_by_the_anchored_rule(step: Step) -> None:
    model = bf16_model()
    report = gate(model, lambda x: run_layers(model, x, step), stress=100.0)
    stress = [f for f in report.errors if f.where == LOGITS and f.case.startswith("stress")]
    assert any(f.check == "anchored" for f in stress), str(report)
    assert not any(f.check == "tolerance" for f in stress)


def test_a_well_conditioned_value_keeps_the_elementwise_check_in_the_stress_draw() -> None:
    model = bf16_model()
    tol = plait.contract.load().tolerance("model", "bfloat16")

    def candidate(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, first = model(x)
        if float(x.abs().max()) < 50:  # NOTE: wrong in the stress draw only
            return logits, first
        first = first.clone()
        first[0, 0] += 3 * (tol.atol + tol.rtol * first[0, 0].abs())
        return logits, first

    report = gate(model, candidate, stress=100.0)
    (failure,) = report.errors
    assert (failure.where, failure.check) == (HIDDEN, "tolerance"), str(report)
    assert failure.case.startswith("stress")
    assert f"{HIDDEN} ({STRESS})" not in report.anchored

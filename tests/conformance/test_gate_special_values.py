"""The gate's special-values draw: NaN, +inf, -inf, -0.0 and +0.0 written into a few positions of
every floating-point input, judged as the contract judges special values (NaN and infinities by
position and sign, finite elements by the tolerances, zero signs under the bitwise rule)."""

from __future__ import annotations

import math

import torch
from torch import nn

from plait.conformance import check
from plait.conformance.draws import SPECIAL_VALUES, with_special_values
from tests.conformance.models import randn, seeded


def relu_mlp() -> nn.Sequential:
    return seeded(0, lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))


def test_a_relu_that_swallows_nan_fails_on_the_special_values_draw() -> None:
    # NOTE: oneDNN's relu/clip post-ops map NaN to 0 where PyTorch's relu keeps NaN; inputs drawn
    # without NaN cannot tell the two apart (every other case is bitwise eager's here)
    model = relu_mlp()

    def fused(x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(model[0](x)).nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf)
        return model[2](hidden)

    x = randn(6, 8, seed=1)
    report = check(model, fused, (x,), candidate_module=model)
    assert not report.ok
    errors = [f for f in report.errors if f.check == "nonfinite"]
    assert errors and all(f.case.startswith("special-values draw") for f in report.errors)
    (first, *_) = errors
    assert first.where == "output" and first.index is not None
    assert first.expected is not None and math.isnan(first.expected)
    assert "candidate finite where reference is NaN" in first.message
    assert "special-values draw" in str(report) and "NaN" in str(report)
    # NOTE: without the special-values draw the gate cannot see it
    assert check(model, fused, (x,), candidate_module=model, special_values=False).ok


def test_eager_with_gradients_and_a_nan_keeping_rewrite_pass_it() -> None:
    model = relu_mlp()

    def clamped(x: torch.Tensor) -> torch.Tensor:
        return model[2](model[0](x).clamp_min(0.0))  # NOTE: clamp_min keeps NaN, as relu does

    x = randn(6, 8, seed=2)
    for candidate, grads in ((model, True), (clamped, False)):
        report = check(model, candidate, (x,), candidate_module=model, grads=grads)
        assert report.ok, str(report)
        assert any(n.startswith("special-values draw: a fresh draw") for n in report.notes)


def test_a_gradient_through_a_nan_must_be_eagers() -> None:
    # NOTE: relu's backward passes the gradient where its input is NaN (NaN <= 0 is false);
    # clamp_min's drops it (NaN >= 0 is false): the same forward, another gradient
    model = relu_mlp()

    def clamped(x: torch.Tensor) -> torch.Tensor:
        return model[2](model[0](x).clamp_min(0.0))

    report = check(model, clamped, (randn(6, 8, seed=2),), candidate_module=model, grads=True)
    assert report.caught("grad[0.bias]", "tolerance")
    assert all(f.case.startswith("special-values draw") for f in report.errors)


def test_an_infinity_of_the_wrong_sign_fails() -> None:
    def flipped(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x == -math.inf, math.inf, x) * 3  # NOTE: -inf read as +inf

    report = check(lambda x: x * 3, flipped, (randn(5, 7, seed=3),))
    assert report.caught("output", "nonfinite")
    assert all(f.case.startswith("special-values draw") for f in report.errors)


def test_a_zero_sign_is_judged_under_the_bitwise_rule_only() -> None:
    def plus_zero(x: torch.Tensor) -> torch.Tensor:
        return x + 0.0  # NOTE: -0.0 + 0.0 is +0.0

    x = randn(4, 6, seed=4)
    assert check(lambda t: t.clone(), plus_zero, (x,)).ok
    report = check(lambda t: t.clone(), plus_zero, (x,), bitwise=True)
    assert report.caught("output", "bitwise")
    assert all(f.case.startswith("special-values draw") for f in report.errors)


def test_inputs_eager_refuses_with_nan_are_noted_not_failed() -> None:
    def refuses_nan(x: torch.Tensor) -> torch.Tensor:
        if bool(x.isnan().any()):
            raise ValueError("NaN in the input")
        return x.exp()

    report = check(refuses_nan, refuses_nan, (randn(3, 4, seed=5),))
    assert report.ok, str(report)
    assert any("raised ValueError('NaN in the input')" in n for n in report.notes)


def test_the_draw_writes_every_special_value_into_float_inputs_only() -> None:
    x, ints, flag = randn(3, 5, seed=6), torch.arange(6).reshape(2, 3), torch.ones(2, dtype=bool)
    (y, same_ints, same_flag), where = with_special_values((x, ints, flag), seed=7)
    assert torch.equal(same_ints, ints) and torch.equal(same_flag, flag)
    assert int(y.isnan().sum()) == 1 and int((y == math.inf).sum()) == 1
    assert int((y == -math.inf).sum()) == 1
    zeros = y[y == 0]
    assert sorted(torch.signbit(zeros).tolist()) == [False, True]
    assert len(where) == 1 and where[0].startswith("input[0]: NaN at")
    # NOTE: a one-element input gets the first of them; an integer-only program is not drawn
    (one,), _ = with_special_values((torch.ones(1),), seed=0)
    assert math.isnan(float(one)) and math.isnan(SPECIAL_VALUES[0])
    report = check(lambda t: t * 2, lambda t: t * 2, (ints,))
    assert any("special-values draw skipped" in n for n in report.notes)


def test_a_factory_gets_a_special_values_draw_too() -> None:
    def factory(seed: int) -> tuple[torch.Tensor]:
        return (randn(4, 4, seed=seed),)

    def swallows(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf)

    report = check(torch.relu, swallows, factory)
    assert report.caught("output", "nonfinite")


def test_where_eager_differs_between_its_layouts_a_candidate_matching_one_passes() -> None:
    # NOTE: eager's hardtanh (relu6) backward drops the gradient at a NaN input in its vectorized
    # kernel and passes it in its scalar one (eight elements or fewer; an expanded gradient, as
    # adaptive_avg_pool2d's backward gives on channels_last): eager's gradients here differ
    # between its layouts, and a candidate that always computes in the contiguous layout matches
    # eager's contiguous run in the channels_last case
    model = seeded(0, lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    ))  # fmt: skip

    def contiguous(x: torch.Tensor) -> torch.Tensor:
        return model(x.contiguous())

    x, layouts = randn(2, 3, 8, 8, seed=0), ("contiguous", "channels_last")
    report = check(model, contiguous, (x,), candidate_module=model, grads=True, layouts=layouts)
    assert report.ok, str(report)
    assert any("eager's own value differs in layout contiguous" in n for n in report.notes)

    # NOTE: a candidate matching neither of eager's answers still fails
    def swallows(x: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.relu6(model[0](x))
        return model[3](model[2](hidden.nan_to_num(nan=0.0, posinf=math.inf, neginf=-math.inf)))

    report = check(model, swallows, (x,), candidate_module=model, grads=True, layouts=layouts)
    assert report.caught("output", "nonfinite")


def test_an_infinity_of_the_other_sign_is_named_by_its_sign() -> None:
    def flipped(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return torch.where(y == -math.inf, math.inf, y)

    report = check(lambda x: x * 2, flipped, (randn(6, 8, seed=2),))
    errors = [f for f in report.errors if f.check == "nonfinite"]
    assert errors, report
    assert "candidate +Inf where reference is -Inf" in errors[0].message, errors[0].message

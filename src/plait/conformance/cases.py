"""The gate's cases: the example, fresh draws, the stress draw and the special-values draw.

Draw ``i`` of a gate seed ``s`` is drawn at ``s * 7919 + i`` (a factory is called with that seed);
the stress draw scales a draw at ``s * 7919`` (a factory's: the seed after its draws) by
``stress``; the special-values draw writes NaN, +inf, -inf, -0.0 and +0.0 into a few random
positions of each floating-point input of a draw at ``s * 7919 + SPECIAL_SEED`` (see
:func:`~plait.conformance.draws.with_special_values`). The stress and special-values draws are
judged alone (not pooled with the other draws: their values are not the other draws').
"""

from __future__ import annotations

from typing import Any

import torch

from plait.conformance.compare import identical
from plait.conformance.draws import (
    Args,
    as_args,
    draw_from_factory,
    draw_like,
    stressed,
    with_special_values,
)
from plait.conformance.report import Failure, Report
from plait.conformance.tree import leaves

Inputs = Any  # a tuple of example arguments, a lone tensor, or a factory(seed) -> arguments
STRESS = "stress draw"
SPECIAL = "special-values draw"
# NOTE: the special-values draw's offset from the gate seed's base: far from the draws (1, 2,
# ...), the added draws (at most MAX_ADDED_DRAWS more) and a factory's stress draw
SPECIAL_SEED = 3959


def alone(label: str) -> bool:
    """Whether the case ``label`` is a draw judged on its own (the stress or special-values draw):
    its statistics are not pooled with the other draws', and it is never added for them."""
    return label.startswith((STRESS, SPECIAL))


def draw_cases(
    inputs: Inputs,
    draws: int,
    stress: float | None,
    special_values: bool,
    seed: int,
    report: Report,
) -> list[tuple[str, Args]]:
    """The cases of one gate call, labelled: the example (unless ``inputs`` is a factory),
    ``draws`` fresh draws, the stress draw (unless ``stress`` is None) and the special-values
    draw (where ``special_values``; noted, and skipped when no input is floating point)."""
    base = seed * 7919
    if is_factory(inputs):
        cases = [(f"draw {i}", fresh(inputs, (), base + i)) for i in range(1, draws + 1)]
        check_fresh(cases, report)
        if stress:
            big = stressed(fresh(inputs, (), base + draws + 1), stress)
            cases.append((f"{STRESS} (x{stress:g})", big))
        example: Args = ()
    else:
        example = as_args(inputs)
        cases = [("example", example)]
        cases += [(f"draw {i}", fresh(inputs, example, base + i)) for i in range(1, draws + 1)]
        if stress:
            cases.append((f"{STRESS} (x{stress:g})", stressed(draw_like(example, base), stress)))
    if special_values:
        drawn = fresh(inputs, example, base + SPECIAL_SEED)
        args, where = with_special_values(drawn, base + SPECIAL_SEED)
        if where:
            cases.append((f"{SPECIAL} (NaN, +inf, -inf, -0.0, +0.0)", args))
            report.note(
                f"{SPECIAL}: a fresh draw with NaN, +inf, -inf, -0.0 and +0.0 written into "
                f"{'; '.join(where)} (integer and bool inputs unchanged); judged where eager "
                "runs on it"
            )
        else:
            report.note(f"{SPECIAL} skipped: no floating-point input to write NaN or inf into")
    return cases


def is_factory(inputs: Inputs) -> bool:
    return callable(inputs) and not isinstance(inputs, torch.Tensor)


def fresh(inputs: Inputs, example: Args, seed: int) -> Args:
    """A fresh draw: the factory's at ``seed``, else one shaped like ``example``."""
    return draw_from_factory(inputs, seed) if is_factory(inputs) else draw_like(example, seed)


def more_draws(
    inputs: Inputs, cases: list[tuple[str, Args]], draws: int, more: int, seed: int
) -> list[tuple[str, Args]]:
    """``more`` fresh draws after ``draws`` (seeds the first draws and the stress draw never
    use: a factory's stress draw takes the seed after its draws)."""
    base, example = seed * 7919 + draws + is_factory(inputs), cases[0][1]
    return [(f"draw {draws + i}", fresh(inputs, example, base + i)) for i in range(1, more + 1)]


def check_fresh(cases: list[tuple[str, Args]], report: Report, first_new: int = 0) -> None:
    """A factory's draws from ``first_new`` on: none repeats an earlier one, none has an
    all-zero float input."""
    flat = [(label, [t for _, t in leaves(args, "input")]) for label, args in cases]
    for i, (label, tensors) in enumerate(flat):
        if i < first_new:
            continue
        for j in range(i):
            other_label, other = flat[j]
            same = len(tensors) == len(other) and all(
                identical(a, b) if isinstance(a, torch.Tensor) else a == b
                for a, b in zip(tensors, other, strict=True)
            )
            # NOTE: empty tensors hold nothing to draw: inputs that are all empty never repeat
            arrays = [t for t in tensors if isinstance(t, torch.Tensor)]
            empty = bool(arrays) and not any(t.numel() for t in arrays)
            if same and tensors and not empty:
                msg = f"the factory returned the same inputs for {other_label} and {label}"
                report.add(Failure("error", "setup", "inputs", label, msg))
    for label, args in cases[first_new:]:
        for name, t in leaves(args, "input"):
            floating = isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel()
            if floating and not bool(t.ne(0).any()):
                msg = "the factory drew an all-zero float input"
                report.add(Failure("error", "setup", name, label, msg))

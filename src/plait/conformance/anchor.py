"""The model-level rule, anchored on float64 and pooled over draws.

For each value (``output[0]``, ``grad[fc.weight]``, ...) and each group of cases that share a
layout and a device, the errors of eager and of the candidate against the float64 reference are
pooled over the draws, then judged once, as a root mean square and at the worst element::

    rms(candidate - ref64) <= factor      * rms(eager - ref64) + floor * u * rms(ref64)
    max|candidate - ref64| <= tail_factor * max|eager - ref64| + floor * u * max|ref64|

Eager's error is the baseline's: eager in the case's own layout and, on the same inputs, in each
of the contract's ``baseline_layouts``, the least accurate of them (per statistic). PyTorch's own
kernels differ in accuracy between layouts (its NCHW and NHWC float32 convolutions by ~2x per
layer), and a candidate is held to eager's accuracy, not to the best of eager's kernels.

A value on which eager has fewer than ``noise_bits`` correct bits is rounding noise, left to the
elementwise budget; unless it is ill-conditioned (eager outside the elementwise budget against
float64 in some case of the group: :class:`Conditioning`), where this rule is the only judge.

NOTE: this is a statistical test on rounding errors. The RMS is the sharp test (its sampling
spread is small); the worst element is a noisy statistic (on a deep net's few independent error
samples, two equally accurate programs' worst errors differ by 2x and more), so it gets the wider
tail factor and catches what an RMS dilutes: a few elements far off. Pooling the draws and the
floor make both reliable for small tensors; docs/conformance.md has the measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from plait.conformance.report import Anchored, Failure, Report

PRIMARY = "eager"


@dataclass(frozen=True)
class ModelRule:
    """The contract's model rule for one value: factor (RMS), tail factor (worst element), floor
    (already times the dtype's unit roundoff: a share of the value's scale) and the noise
    threshold in bits."""

    factor: float
    tail_factor: float
    floor: float
    noise_bits: float | None = None


@dataclass(frozen=True)
class Conditioning:
    """Eager's own output against float64 in one case, where it is outside the elementwise budget
    (``rtol``, ``atol``) there: ``outside`` of ``elements`` elements, at the worst one an error
    ``error`` where the budget allows ``allowed``. Such a value is ill-conditioned: the program
    amplifies rounding beyond the budget, so two correct programs need not agree within it."""

    outside: int
    elements: int
    error: float
    allowed: float
    rtol: float
    atol: float

    @property
    def share(self) -> float:
        return self.error / self.allowed if self.allowed > 0 else math.inf


@dataclass
class _Worst:
    case: str
    index: tuple[int, ...]
    ref64: float
    eager: float
    actual: float


@dataclass
class _Errors:
    """Pooled statistics of one program's errors against float64 over the cases of a group."""

    worst: float = 0.0
    sumsq: float = 0.0
    count: int = 0
    cases: int = 0

    def add(self, err: torch.Tensor, n: int) -> None:
        self.worst = max(self.worst, float(err.max()))
        self.sumsq += float(err.square().sum())
        self.count += n
        self.cases += 1

    @property
    def rms(self) -> float:
        return math.sqrt(self.sumsq / self.count) if self.count else 0.0


@dataclass
class _Stat:
    rule: ModelRule
    cand: _Errors = field(default_factory=_Errors)
    eager: dict[str, _Errors] = field(default_factory=dict)
    ref: _Errors = field(default_factory=_Errors)  # NOTE: of |ref64| itself: the value's scale.
    cases: list[str] = field(default_factory=list)
    at: _Worst | None = None
    ill: list[Conditioning] = field(default_factory=list)  # NOTE: one per ill-conditioned case.

    @property
    def scale(self) -> float:
        return self.ref.worst


class AnchorPool:
    """Collects anchored error statistics per (value, group); :meth:`finalize` judges them."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, str], _Stat] = {}

    def add(
        self,
        where: str,
        group: str,
        case: str,
        eager: torch.Tensor,
        actual: torch.Tensor,
        ref64: torch.Tensor,
        mask: torch.Tensor,
        rule: ModelRule,
        baselines: dict[str, torch.Tensor] | None = None,
        conditioning: Conditioning | None = None,
    ) -> None:
        """Add one case's errors; all tensors are float64 on the CPU, ``mask`` marks the
        elements finite in all three. ``baselines`` are eager's outputs in other layouts on the
        same inputs (by layout name), also candidates for the baseline. ``conditioning``: where
        eager itself is outside the elementwise budget against float64 in this case (then the
        value is judged by this rule even where eager's error is noise-sized)."""
        if not bool(mask.any()):
            return
        stat = self._stats.setdefault((where, group), _Stat(rule))
        if conditioning is not None:
            stat.ill.append(conditioning)
        zero = torch.zeros((), dtype=torch.float64)
        n = int(mask.sum())
        err_c = (actual - ref64).abs().where(mask, zero)
        stat.cases.append(case)
        stat.ref.add(ref64.abs().where(mask, zero), n)
        stat.eager.setdefault(PRIMARY, _Errors()).add((eager - ref64).abs().where(mask, zero), n)
        for layout, other in (baselines or {}).items():
            if other.shape != ref64.shape or bool((mask & ~torch.isfinite(other)).any()):
                continue  # NOTE: not the same function there (another shape, another NaN/Inf).
            err = (other - ref64).abs().where(mask, zero)
            stat.eager.setdefault(f"{PRIMARY}, layout {layout}", _Errors()).add(err, n)
        stat.cand.add(err_c, n)
        if stat.at is None or float(err_c.max()) >= stat.cand.worst:
            flat = int(err_c.reshape(-1).argmax())
            idx = index_of(flat, ref64.shape)
            values = value_at(ref64, idx), value_at(eager, idx), value_at(actual, idx)
            stat.at = _Worst(case, idx, *values)

    def samples(self) -> list[tuple[str, str, int, int]]:
        """Per pooled value: (value, group, error samples pooled, cases) so far."""
        return [(w, g, s.cand.count, s.cand.cases) for (w, g), s in self._stats.items()]

    def finalize(self, report: Report) -> None:
        """Judge every pooled value against the model rule; record failures in ``report``."""
        for (where, group), stat in self._stats.items():
            _judge(report, where, group, stat)
        self._stats.clear()


def _judge(report: Report, where: str, group: str, stat: _Stat) -> None:
    rule, primary = stat.rule, stat.eager[PRIMARY]
    noise = None if rule.noise_bits is None else 2**-rule.noise_bits * stat.scale
    if stat.ill:
        _note_ill_conditioned(report, where, group, stat)
    elif noise is not None and primary.worst >= noise:
        report.count("anchored (noise, skipped)")
        report.note(
            f"{where} ({group}): eager has fewer than {rule.noise_bits:g} correct bits "
            f"(error {primary.worst:.3g} at magnitude {stat.scale:.3g}): rounding noise, "
            "judged by the elementwise budget only"
        )
        return
    # NOTE: an ill-conditioned value's baselines are not held to noise_bits: eager is not either.
    sources = _baselines(report, where, group, stat, None if stat.ill else noise)
    rms_from, rms_base = max(((k, v.rms) for k, v in sources.items()), key=lambda kv: kv[1])
    max_from, max_base = max(((k, v.worst) for k, v in sources.items()), key=lambda kv: kv[1])
    report.count("anchored")
    rms_budget = rule.factor * rms_base + rule.floor * stat.ref.rms
    max_budget = rule.tail_factor * max_base + rule.floor * stat.scale
    rms_share, max_share = _share(stat.cand.rms, rms_budget), _share(stat.cand.worst, max_budget)
    key = f"{where} ({group})"
    report.margins[key] = max(rms_share, max_share)
    report.anchored[key] = Anchored(
        rms_error=stat.cand.rms, rms_eager=primary.rms, rms_baseline=rms_base,
        rms_budget=rms_budget, error=stat.cand.worst, eager=primary.worst, baseline=max_base,
        budget=max_budget, baseline_from=rms_from, rms_scale=stat.ref.rms, scale=stat.scale,
        draws=len(stat.cases), factor=rule.factor, tail_factor=rule.tail_factor, floor=rule.floor,
    )  # fmt: skip
    pooled = f" (pooled over {len(stat.cases)} draws, {group})" if len(stat.cases) > 1 else ""
    if rms_share > 1:
        _fail(report, where, stat, stat.cand.rms, rms_budget, (
            f"RMS error against float64 {stat.cand.rms:.3g} > factor {rule.factor:g} x "
            f"{_whose(rms_from)} RMS error {rms_base:.3g} + floor "
            f"{rule.floor * stat.ref.rms:.3g}{pooled}"
        ))  # fmt: skip
    if max_share > 1:
        _fail(report, where, stat, stat.cand.worst, max_budget, (
            f"worst error against float64 {stat.cand.worst:.3g} > tail factor "
            f"{rule.tail_factor:g} x {_whose(max_from)} worst {max_base:.3g} + floor "
            f"{rule.floor * stat.scale:.3g}{pooled}"
        ))  # fmt: skip


def _note_ill_conditioned(report: Report, where: str, group: str, stat: _Stat) -> None:
    worst = max(stat.ill, key=lambda c: c.share)
    outside, elements = sum(c.outside for c in stat.ill), sum(c.elements for c in stat.ill)
    eager = stat.eager[PRIMARY]
    report.note(
        f"{where} ({group}): ill-conditioned: eager's own output is outside the elementwise "
        f"budget (rtol {worst.rtol:g} / atol {worst.atol:g}) against float64 at {outside} of "
        f"{elements} element(s) in {len(stat.ill)} of {len(stat.cases)} draw(s) (worst error "
        f"{worst.error:.3g} where the budget allows {worst.allowed:.3g}; RMS error "
        f"{eager.rms:.3g} at RMS magnitude {stat.ref.rms:.3g}): two correct programs need not "
        "agree within it, so the anchored model rule judges it there, not the elementwise "
        "check against eager, and not as rounding noise"
    )


def _share(error: float, budget: float) -> float:
    if budget > 0:
        return error / budget
    return 0.0 if error == 0 else math.inf


def _whose(source: str) -> str:
    return "eager's" if source == PRIMARY else f"eager's ({source.removeprefix(PRIMARY + ', ')})"


def _fail(report: Report, where: str, stat: _Stat, error: float, budget: float, msg: str) -> None:
    at = stat.at
    if at is None:
        return
    msg += f"; at the worst element, expected is the float64 value, eager gave {at.eager:.9g}"
    report.add(
        Failure("error", "anchored", where, at.case, msg, at.index, at.ref64, at.actual, error,
                budget)
    )  # fmt: skip


def _baselines(
    report: Report, where: str, group: str, stat: _Stat, noise: float | None
) -> dict[str, _Errors]:
    """Eager's runs that compute the same function: eager in the case's own layout, and in each
    baseline layout that ran on every case and keeps ``noise_bits`` correct bits (a layout in which
    eager draws other random numbers, say, is no baseline)."""
    out = {PRIMARY: stat.eager[PRIMARY]}
    for source, errors in stat.eager.items():
        if source == PRIMARY:
            continue
        if errors.cases != len(stat.cases) or (noise is not None and errors.worst >= noise):
            report.note(
                f"{where} ({group}): {source} is not a baseline: it differs from float64 beyond "
                f"rounding (error {errors.worst:.3g} at magnitude {stat.scale:.3g}) or did not "
                "run on every draw"
            )
            continue
        out[source] = errors
    return out


def index_of(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The index tuple of flat (row-major) position ``flat`` in ``shape``."""
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def value_at(t: torch.Tensor, idx: tuple[int, ...]) -> float:
    return float(t[idx].item())

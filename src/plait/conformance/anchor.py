"""The model-level rule, anchored on float64 and pooled over draws.

For each value (``output[0]``, ``grad[fc.weight]``, ...) and each group of cases that share a
layout and a device, the worst errors of eager and of the candidate against the float64 reference
are pooled over the draws, then judged once::

    max|candidate - ref64| <= factor * max|eager - ref64| + floor * u * max|ref64|

NOTE: this is a statistical test on rounding errors. A scalar has one error sample per draw, and
the ratio of two single samples exceeds 2 about a third of the time; pooling the draws (all from
one input distribution) and the floor make the test reliable for small tensors, see
docs/conformance.md for the measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from plait.conformance.report import Failure, Report


@dataclass
class _Worst:
    case: str
    index: tuple[int, ...]
    ref64: float
    eager: float
    actual: float


@dataclass
class _Stat:
    factor: float
    floor: float  # NOTE: already in value units per unit of scale: floor * u of the dtype.
    noise_bits: float | None
    worst_c: float = 0.0
    worst_e: float = 0.0
    scale: float = 0.0
    cases: list[str] = field(default_factory=list)
    at: _Worst | None = None


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
        factor: float,
        floor: float,
        noise_bits: float | None = None,
    ) -> None:
        """Add one case's errors; all tensors are float64 on the CPU, ``mask`` marks the
        elements finite in all three."""
        if not bool(mask.any()):
            return
        stat = self._stats.setdefault((where, group), _Stat(factor, floor, noise_bits))
        zero = torch.zeros((), dtype=torch.float64)
        err_c = (actual - ref64).abs().where(mask, zero)
        err_e = (eager - ref64).abs().where(mask, zero)
        stat.cases.append(case)
        stat.scale = max(stat.scale, float(ref64.abs().where(mask, zero).max()))
        stat.worst_e = max(stat.worst_e, float(err_e.max()))
        worst_c = float(err_c.max())
        if stat.at is None or worst_c > stat.worst_c:
            flat = int(err_c.reshape(-1).argmax())
            idx = index_of(flat, ref64.shape)
            stat.worst_c = worst_c
            values = value_at(ref64, idx), value_at(eager, idx), value_at(actual, idx)
            stat.at = _Worst(case, idx, *values)

    def finalize(self, report: Report) -> None:
        """Judge every pooled value against the model rule; record failures in ``report``."""
        for (where, group), stat in self._stats.items():
            if stat.noise_bits is not None and stat.worst_e >= 2**-stat.noise_bits * stat.scale:
                report.count("anchored (noise, skipped)")
                report.note(
                    f"{where} ({group}): eager has fewer than {stat.noise_bits:g} correct bits "
                    f"(error {stat.worst_e:.3g} at magnitude {stat.scale:.3g}): rounding noise, "
                    "judged by the elementwise budget only"
                )
                continue
            report.count("anchored")
            floor = stat.floor * stat.scale
            allowed = stat.factor * stat.worst_e + floor
            used = stat.worst_c / allowed if allowed > 0 else (0.0 if stat.worst_c == 0 else 1e300)
            report.margins[f"{where} ({group})"] = used
            if stat.worst_c <= allowed or stat.at is None:
                continue
            at = stat.at
            n = len(stat.cases)
            pooled = f" (pooled over {n} draws, {group})" if n > 1 else ""
            msg = (
                f"worst error against float64 {stat.worst_c:.3g} > factor {stat.factor:g} x "
                f"eager's worst {stat.worst_e:.3g} + floor {floor:.3g}{pooled}; expected is the "
                f"float64 value, eager gave {at.eager:.9g}"
            )
            report.add(
                Failure(
                    "error", "anchored", where, at.case, msg, at.index, at.ref64, at.actual,
                    stat.worst_c, allowed,
                )
            )  # fmt: skip
        self._stats.clear()


def index_of(flat: int, shape: torch.Size) -> tuple[int, ...]:
    """The index tuple of flat (row-major) position ``flat`` in ``shape``."""
    idx = []
    for size in reversed(shape):
        idx.append(flat % size)
        flat //= size
    return tuple(reversed(idx))


def value_at(t: torch.Tensor, idx: tuple[int, ...]) -> float:
    return float(t[idx].item())

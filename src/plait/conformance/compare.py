"""Judging one value against the contract: non-finite positions, tolerances, the float64 anchor.

Rules, in order, for a floating-point tensor (integers and bools must be equal):
1. NaN and Inf must match in position and kind, whatever the tolerances.
2. ``bitwise``: every element identical (order-preserving transforms, determinism).
3. elementwise: ``|a - e| <= atol * max(1, S) + rtol * |e|``, ``S`` the largest finite ``|e|``;
   except where rule 4 applies and eager is itself outside this budget around ``z`` (the value is
   ill-conditioned: the program amplifies rounding beyond the budget, so two correct programs
   need not agree within it): then rule 4 alone judges the value in that case, counted as
   ``tolerance (ill-conditioned: anchored)`` with a note of eager's own error against ``z``. An
   exact row (rtol = atol = 0) is never ill-conditioned.
4. anchored, when a float64 reference ``z`` exists, pooled over draws by
   :class:`~plait.conformance.anchor.AnchorPool` (``u`` the unit roundoff, ``e`` the least
   accurate of eager's runs over the contract's baseline layouts):
   ``rms(a - z) <= factor * rms(e - z) + floor * u * rms(z)`` and
   ``max|a - z| <= tail_factor * max|e - z| + floor * u * max|z|``; skipped as rounding noise
   where eager's worst error is above ``2^-noise_bits * max|z|``, unless the value was
   ill-conditioned in some case of its group. The stress draw is a group of its own where rule 4
   judges only ill-conditioned values (``ill_only``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from plait.conformance.anchor import AnchorPool, Conditioning, ModelRule
from plait.conformance.anchor import index_of as _index
from plait.conformance.anchor import value_at as _at
from plait.conformance.report import Failure, Report
from plait.contract import Tolerance


@dataclass(frozen=True)
class Budget:
    """The contract's budget for one value: op-class tolerance plus model rule and bitwise mode."""

    tol: Tolerance
    factor: float | None
    floor: float
    bitwise: bool = False
    noise_bits: float | None = None
    tail_factor: float | None = None


def compare(
    report: Report,
    where: str,
    case: str,
    expected: Any,
    actual: Any,
    budget: Budget,
    anchor: Any = None,
    *,
    pool: AnchorPool | None = None,
    group: str = "",
    baselines: dict[str, Any] | None = None,
    ill_only: bool = False,
) -> bool:
    """Judge ``actual`` against ``expected`` (and the float64 ``anchor``); record failures.

    The anchored rule goes to ``pool`` (judged when the pool is finalized, over all draws of
    ``group``), or is judged at once on this case alone when there is no pool. ``baselines``:
    eager's values in other layouts on the same inputs (by layout), candidates for the baseline.
    ``ill_only``: the anchored rule judges the value only where it is ill-conditioned in this case
    (the stress draw, whose well-conditioned values keep the elementwise check alone).
    Returns True when no error was recorded (so far).
    """
    before = len(report.errors)
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        _compare_plain(report, where, case, expected, actual)
    elif _same_meta(report, where, case, expected, actual):
        anchored = _Anchoring(anchor, pool, group, baselines or {}, ill_only)
        _compare_tensors(report, where, case, expected, actual, budget, anchored)
    return len(report.errors) == before


@dataclass(frozen=True)
class _Anchoring:
    """Where the anchored rule's statistics go: the float64 value, the pool and its group, and
    eager's values in the other baseline layouts."""

    anchor: Any
    pool: AnchorPool | None
    group: str
    baselines: dict[str, Any]
    ill_only: bool = False


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality: same shape, dtype and bits (so -0.0 differs from 0.0); every NaN equals
    every NaN, since NaN sign and payload bits differ between correct kernels."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    if not a.dtype.is_floating_point:
        return bool(torch.equal(a, b))
    nan_a, nan_b = a.isnan(), b.isnan()
    if not torch.equal(nan_a, nan_b):
        return False
    bits = _SAME_SIZE_INT[a.element_size()]
    zero = torch.zeros((), dtype=a.dtype)
    return bool(torch.equal(a.where(~nan_a, zero).view(bits), b.where(~nan_b, zero).view(bits)))


_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the spacing of ``dtype``'s floats at 1.0 (2^-24 for float32)."""
    return float(torch.finfo(dtype).eps) / 2


def _compare_plain(report: Report, where: str, case: str, expected: Any, actual: Any) -> None:
    report.count("value")
    if isinstance(expected, torch.Tensor) != isinstance(actual, torch.Tensor):
        kinds = f"{type(expected).__name__} vs {type(actual).__name__}"
        report.add(Failure("error", "structure", where, case, f"reference vs candidate: {kinds}"))
        return
    # NOTE: True == 1 == 1.0 in Python; a program that returns another scalar type is wrong
    scalars = (bool, int, float, complex)
    same = expected == actual
    if isinstance(expected, scalars) and type(expected) is not type(actual):
        same = False
    if isinstance(expected, float) and isinstance(actual, float):
        same = same or (math.isnan(expected) and math.isnan(actual))
    if not same:
        msg = f"non-tensor values differ: {expected!r} vs {actual!r}"
        report.add(Failure("error", "value", where, case, msg))


def _same_meta(report: Report, where: str, case: str, e: torch.Tensor, a: torch.Tensor) -> bool:
    report.count("meta")
    for check, left, right in (
        ("shape", tuple(e.shape), tuple(a.shape)),
        ("dtype", e.dtype, a.dtype),
        ("device", e.device, a.device),
    ):
        if left != right:
            msg = f"reference {check} {left} but candidate {right}"
            report.add(Failure("error", check, where, case, msg))
            return False
    return True


def _compare_tensors(
    report: Report,
    where: str,
    case: str,
    e_raw: torch.Tensor,
    a_raw: torch.Tensor,
    budget: Budget,
    anchoring: _Anchoring,
) -> None:
    if e_raw.numel() == 0:
        return
    if not (e_raw.dtype.is_floating_point or e_raw.dtype.is_complex):
        _compare_exact(report, where, case, e_raw, a_raw)
        return
    if budget.bitwise:
        _compare_bitwise(report, where, case, e_raw, a_raw, "bitwise")
        return
    e, a = _as_real64(e_raw), _as_real64(a_raw)
    if not _nonfinite_match(report, where, case, e, a):
        return
    finite = torch.isfinite(e) & torch.isfinite(a)
    anchor = anchoring.anchor
    z = _as_real64(anchor) if isinstance(anchor, torch.Tensor) else None
    if budget.factor is None or z is None or z.shape != e.shape:
        _elementwise(report, where, case, e, a, finite, budget)
        return
    mask = finite & torch.isfinite(z)
    # NOTE: the elementwise budget against eager is a test only where eager meets it against
    # float64; where eager does not (the program amplifies rounding beyond it), two correct
    # programs need not agree within it, and the anchored rule judges the value alone.
    conditioning = _conditioning(e, z, mask, budget)
    if conditioning is None:
        _elementwise(report, where, case, e, a, finite, budget)
        if anchoring.ill_only:
            return
    else:
        report.count("tolerance (ill-conditioned: anchored)")
    dtype = e_raw.dtype if e_raw.dtype.is_floating_point else torch.float32
    tail = budget.tail_factor if budget.tail_factor is not None else budget.factor
    floor = budget.floor * unit_roundoff(dtype)
    rule = ModelRule(budget.factor, tail, floor, budget.noise_bits)
    target = anchoring.pool if anchoring.pool is not None else AnchorPool()
    # NOTE: eager in another layout sets the baseline only where it is what a candidate may be:
    # the same value within the elementwise budget (not other random numbers, say).
    others = {}
    for layout, other in anchoring.baselines.items():
        if isinstance(other, torch.Tensor) and other.dtype == e_raw.dtype:
            o = _as_real64(other)
            same = o.shape == e.shape and torch.equal(torch.isfinite(o), torch.isfinite(e))
            if same and not bool(_outside(e, o, finite, budget).any()):
                others[layout] = o
                continue
        why = "ill-conditioned here" if conditioning else "random numbers drawn in memory order?"
        report.note(
            f"{where} ({anchoring.group}): eager in layout {layout} is not a baseline: it differs "
            f"from eager beyond the elementwise budget ({why})"
        )
    target.add(where, anchoring.group, case, e, a, z, mask, rule, others, conditioning)
    if anchoring.pool is None:
        target.finalize(report)


def _compare_exact(report: Report, where: str, case: str, e: torch.Tensor, a: torch.Tensor) -> None:
    report.count("exact")
    e, a = e.detach().cpu(), a.detach().cpu()
    if torch.equal(e, a):
        return
    idx = _index(int((e != a).reshape(-1).nonzero()[0]), e.shape)
    ev, av = float(e[idx].item()), float(a[idx].item())
    report.add(Failure("error", "exact", where, case, "integer/bool values differ", idx, ev, av))


def _compare_bitwise(
    report: Report, where: str, case: str, e: torch.Tensor, a: torch.Tensor, check: str
) -> None:
    report.count(check)
    if identical(e, a):
        return
    e64, a64 = _as_real64(e), _as_real64(a)
    diff = (a64 - e64).abs().nan_to_num(nan=math.inf)
    diff[(e64 == a64) | (e64.isnan() & a64.isnan())] = 0
    flat = int(diff.reshape(-1).argmax())
    idx = _index(flat, e64.shape)
    msg = "not bitwise equal" if check == "bitwise" else "two calls on identical inputs differ"
    report.add(
        Failure(
            "error", check, where, case, msg, idx, _at(e64, idx), _at(a64, idx), _at(diff, idx), 0.0
        )
    )


def compare_calls(report: Report, where: str, case: str, first: Any, second: Any) -> None:
    """Two candidate calls on identical inputs must agree bitwise (determinism)."""
    tensors = isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)
    if tensors and first.shape == second.shape and first.dtype == second.dtype:
        _compare_bitwise(report, where, case, first, second, "nondeterminism")
        return
    compare(report, where, case, first, second, _EXACT)


def _nonfinite_match(
    report: Report, where: str, case: str, e: torch.Tensor, a: torch.Tensor
) -> bool:
    report.count("nonfinite")
    fin_e, fin_a = torch.isfinite(e), torch.isfinite(a)
    same_kind = (e.isnan() & a.isnan()) | (e == a)
    bad = (fin_e != fin_a) | (~fin_e & ~fin_a & ~same_kind)
    if not bool(bad.any()):
        return True
    count = int(bad.sum())
    idx = _index(int(bad.reshape(-1).nonzero()[0]), e.shape)
    ev, av = _at(e, idx), _at(a, idx)
    msg = (
        f"NaN/Inf positions differ at {count} element(s): candidate {_kind(av)} "
        f"where reference is {_kind(ev)}"
    )
    report.add(Failure("error", "nonfinite", where, case, msg, idx, ev, av))
    return False


def _elementwise(
    report: Report,
    where: str,
    case: str,
    e: torch.Tensor,
    a: torch.Tensor,
    finite: torch.Tensor,
    budget: Budget,
) -> None:
    report.count("tolerance")
    if not bool(finite.any()):
        return
    over = _outside(e, a, finite, budget)
    if not bool(over.any()):
        return
    scale = max(1.0, float(e[finite].abs().max()))
    err = (a - e).abs().where(finite, torch.zeros((), dtype=e.dtype))
    allowed = budget.tol.atol * scale + budget.tol.rtol * e.abs()
    score = torch.where(allowed > 0, err / allowed, torch.where(over, math.inf, 0.0))
    idx = _index(int(score.reshape(-1).argmax()), e.shape)
    msg = (
        f"{int(over.sum())} element(s) outside rtol {budget.tol.rtol:g} / atol "
        f"{budget.tol.atol:g} (x scale {scale:.3g})"
    )
    report.add(
        Failure(
            "error", "tolerance", where, case, msg, idx, _at(e, idx), _at(a, idx),
            _at(err, idx), _at(allowed, idx),
        )
    )  # fmt: skip


def _conditioning(
    e: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, budget: Budget
) -> Conditioning | None:
    """Eager's own elementwise error against the float64 value ``z``, where it is outside the
    budget there (the value is ill-conditioned); None where eager meets it. An exact row
    (``data_movement``) is never ill-conditioned: it allows no rounding to amplify, and eager off
    float64 there says only that the program rounds."""
    if budget.tol.exact:
        return None
    over = _outside(z, e, mask, budget)
    if not bool(over.any()):
        return None
    scale = max(1.0, float(z[mask].abs().max()))
    allowed = budget.tol.atol * scale + budget.tol.rtol * z.abs()
    share = ((e - z).abs() / allowed).where(over, torch.zeros((), dtype=e.dtype))
    idx = _index(int(share.reshape(-1).argmax()), e.shape)
    return Conditioning(
        int(over.sum()), int(mask.sum()), _at((e - z).abs(), idx), _at(allowed, idx),
        budget.tol.rtol, budget.tol.atol,
    )  # fmt: skip


def _outside(
    e: torch.Tensor, a: torch.Tensor, finite: torch.Tensor, budget: Budget
) -> torch.Tensor:
    """Where ``a`` is outside the elementwise budget around ``e`` (finite positions only)."""
    if not bool(finite.any()):
        return torch.zeros_like(finite)
    scale = max(1.0, float(e[finite].abs().max()))
    err = (a - e).abs().where(finite, torch.zeros((), dtype=e.dtype))
    return err > budget.tol.atol * scale + budget.tol.rtol * e.abs()


def _as_real64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.dtype.is_complex:
        t = torch.view_as_real(t.resolve_conj())
    return t.to(torch.float64)


def _kind(value: float) -> str:
    """NaN, +Inf, -Inf or finite: an infinity of the other sign is named as such."""
    if math.isnan(value):
        return "NaN"
    return ("+Inf" if value > 0 else "-Inf") if math.isinf(value) else "finite"


_EXACT = Budget(Tolerance(0.0, 0.0, "float64", False), None, 0.0, bitwise=True)

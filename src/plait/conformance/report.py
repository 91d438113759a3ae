"""What the gate found: a :class:`Report` of :class:`Failure` records, readable as text."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Failure:
    """One broken promise.

    ``where`` names the value (``output[0]``, ``grad[fc.weight]``, ``buffer[bn.running_mean]``,
    ``input[1] after call``); ``case`` names the run (``draw 2, layout channels_last, device cpu``);
    ``check`` names the rule (``nonfinite``, ``tolerance``, ``anchored``, ``bitwise``,
    ``nondeterminism``, ``alias``, ``shape``, ``dtype``, ``structure``, ``exception``, ...).
    ``index`` is the worst element's index, ``expected``/``actual`` its two values, ``error`` the
    error measured and ``budget`` the contract budget it broke.
    """

    severity: Severity
    check: str
    where: str
    case: str
    message: str
    index: tuple[int, ...] | None = None
    expected: float | None = None
    actual: float | None = None
    error: float | None = None
    budget: float | None = None

    def __str__(self) -> str:
        head = (
            f"{self.severity.upper():7} {self.check:14} {self.where} @ {self.case}: {self.message}"
        )
        parts = []
        if self.index is not None:
            parts.append(f"index {self.index}")
        if self.expected is not None or self.actual is not None:
            parts.append(f"expected {_num(self.expected)}, got {_num(self.actual)}")
        if self.error is not None:
            parts.append(f"error {_num(self.error)}")
        if self.budget is not None:
            parts.append(f"budget {_num(self.budget)}")
        return head + ("\n          " + "; ".join(parts) if parts else "")


@dataclass(frozen=True)
class Anchored:
    """The model rule's statistics for one value, pooled over the draws of one layout and device.

    ``rms_error`` is the candidate's RMS error against float64, ``rms_eager`` eager's (in the
    case's own layout), ``rms_baseline`` the one the factor scaled (the largest over the
    contract's baseline layouts; ``baseline_from`` says whose) and ``rms_budget`` what the rule
    allowed; ``error``, ``eager``, ``baseline`` and ``budget`` the same for the worst element
    and the tail factor. ``rms_scale`` and ``scale`` are the RMS and largest magnitude of the
    float64 value. ``factor``, ``tail_factor`` and ``floor`` (times the dtype's unit roundoff) are
    the rule that was applied.
    """

    rms_error: float
    rms_eager: float
    rms_baseline: float
    rms_budget: float
    error: float
    eager: float
    baseline: float
    budget: float
    baseline_from: str
    rms_scale: float
    scale: float
    draws: int
    factor: float
    tail_factor: float
    floor: float

    @property
    def shares(self) -> tuple[float, float]:
        """The shares of the RMS budget and of the worst-element budget used."""
        return _ratio(self.rms_error, self.rms_budget), _ratio(self.error, self.budget)


@dataclass(frozen=True)
class Judged:
    """A specialization of a compiled candidate the gate judged: ``index`` in its
    ``specializations``, ``key`` (its program and guard set), ``how`` it was chosen (the user
    calls it ran, or made by the check), the ``semantic_hash`` and ``cache_key`` of its
    manifest, its ``guards`` and the ``settings`` of the calls it runs (and the gate ran it
    under)."""

    index: int
    key: str
    how: str
    semantic_hash: str
    cache_key: str
    guards: tuple[str, ...]
    settings: dict[str, Any]

    def __str__(self) -> str:
        grad = self.settings.get("torch.is_grad_enabled()")
        mode = "grad mode unknown" if grad is None else "grad mode" if grad else "no_grad"
        parts = [f"specialization #{self.index} (key {self.key[:16]}", mode]
        if self.semantic_hash:
            parts.append(f"program {self.semantic_hash[:16]}")
        if self.cache_key:
            parts.append(f"cache key {self.cache_key[:16]}")
        parts.append(f"{len(self.guards)} guards)")
        return ", ".join(parts) + f": {self.how}"


def _ratio(error: float, budget: float) -> float:
    if budget > 0:
        return error / budget
    return 0.0 if error == 0 else float("inf")


@dataclass
class Report:
    """The gate's verdict. ``ok`` is True when no failure has severity ``"error"``.

    ``margins`` maps each anchored value to the share of its model-rule budget it used (worst
    error / budget; above 1 is a failure), to show how close a passing candidate came;
    ``anchored`` holds the statistics behind each (:class:`Anchored`). ``judged`` names the
    specializations of a compiled candidate that were judged (:class:`Judged`).

    Example:
        >>> r = Report()
        >>> r.ok, r.caught()
        (True, False)
        >>> r.add(Failure("error", "anchored", "output[0]", "draw 1", "too far"))
        >>> r.ok, r.caught("output")
        (False, True)
    """

    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks_run: Counter[str] = field(default_factory=Counter)
    contract_version: str = ""
    margins: dict[str, float] = field(default_factory=dict)
    anchored: dict[str, Anchored] = field(default_factory=dict)
    judged: list[Judged] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Failure]:
        return [f for f in self.failures if f.severity == "error"]

    @property
    def warnings(self) -> list[Failure]:
        return [f for f in self.failures if f.severity == "warning"]

    def add(self, failure: Failure) -> None:
        self.failures.append(failure)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def count(self, check: str, n: int = 1) -> None:
        self.checks_run[check] += n

    def caught(self, where: str | None = None, check: str | None = None) -> bool:
        """True when an error was reported (at a ``where`` containing ``where``, by ``check``).

        This is the kill criterion of the mutant suite: a mutant is killed when the gate reports
        an error, and killed for the right reason when it reports it at the expected place.
        """
        return any(
            (where is None or where in f.where or where in f.case)
            and (check is None or f.check == check)
            for f in self.errors
        )

    def raise_if_failed(self) -> None:
        """Raise :class:`ConformanceError` carrying this report when it is not ok."""
        if not self.ok:
            raise ConformanceError(self)

    def __str__(self) -> str:
        verdict = "PASSED" if self.ok else "FAILED"
        total = sum(self.checks_run.values())
        lines = [
            f"conformance {verdict}: {len(self.errors)} error(s), {len(self.warnings)} "
            f"warning(s), {total} checks (contract {self.contract_version or '?'})"
        ]
        shown = self.errors[:20] + self.warnings[:10]
        lines += [f"  judged: {j}" for j in self.judged]
        lines += [f"  {f}" for f in shown]
        hidden = len(self.failures) - len(shown)
        if hidden > 0:
            lines.append(f"  ... and {hidden} more")
        if self.margins:
            name, used = max(self.margins.items(), key=lambda kv: kv[1])
            lines.append(f"  closest to its budget: {name} used {used:.0%} of the model rule")
        if self.checks_run:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.checks_run.items()))
            lines.append(f"  checks: {counts}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


class ConformanceError(AssertionError):
    """The candidate does not conform to the contract; ``.report`` says where and by how much."""

    def __init__(self, report: Report) -> None:
        super().__init__(str(report))
        self.report = report


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.9g}"

"""Judging a candidate run against a reference run: every output, buffer, mutated input and
gradient, by name; plus aliasing, poisoning and the determinism of repeated calls."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.conformance.anchor import AnchorPool
from plait.conformance.compare import Budget, compare, compare_calls, identical
from plait.conformance.report import Failure, Report
from plait.conformance.runner import Run
from plait.conformance.tree import leaves, skeleton
from plait.contract import FACTOR_DTYPES, Contract, dtype_key

Values = dict[str, Any]


@dataclass(frozen=True)
class Judge:
    """The contract as applied to one gate call: which op class, bitwise or not."""

    contract: Contract
    op_class: str
    bitwise: bool
    pool: AnchorPool = field(default_factory=AnchorPool)
    # NOTE: the floating dtype the reference computes in where its values are wider (a
    # torch.autocast region): those values are judged by that dtype's rows
    precision: torch.dtype | None = None

    def budget(self, value: Any, anchored: bool) -> Budget:
        dtype = value.dtype if isinstance(value, torch.Tensor) else torch.float64
        p = self.precision
        if p is not None and dtype.is_floating_point and dtype.itemsize > p.itemsize:
            dtype = p
        if dtype.is_complex:
            dtype = dtype.to_real()  # NOTE: complex64 is float32 pairs: judged by float32's row
        try:
            key = dtype_key(dtype)
        except ValueError:
            key = "float64"  # NOTE: exotic dtypes: judged as the widest real row.
        factor, floor, tail = None, 0.0, None
        if anchored and key in FACTOR_DTYPES:
            factor, floor = self.contract.model_factor(key), self.contract.model_floor(key)
            tail = self.contract.model_tail_factor(key)
        bitwise = self.bitwise and self.contract.bitwise_order_preserving
        tol = self.contract.tolerance(self.op_class, key)
        return Budget(tol, factor, floor, bitwise, self.contract.noise_bits, tail)

    def nondeterminism_allowed(self, value: Any) -> bool:
        if not isinstance(value, torch.Tensor):
            return False
        try:
            return self.contract.tolerance(self.op_class, value.dtype).nondeterminism_allowed
        except ValueError:
            return False


def values(result: Run) -> Values:
    """Everything a run produced, flat and named: outputs, buffers, inputs after, gradients."""
    named: Values = dict(leaves(result.outputs, "output"))
    named.update({f"buffer[{n}]": b for n, b in result.buffers.items()})
    named.update({f"{n} after call": t for n, t in leaves(result.inputs_after, "input")})
    named.update(result.grads)
    return named


# NOTE: prefixes a wrapper puts before the wrapped module's state names: torch.compile's
# OptimizedModule (``_orig_mod.``), DataParallel and DistributedDataParallel (``module.``).
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def align(ref: Values, cand: Values) -> dict[str, str]:
    """Map each reference name to the candidate's: exact; else the candidate name that is exact
    once wrapper prefixes are peeled off (``buffer[_orig_mod.bn.running_mean]`` for
    ``buffer[bn.running_mean]``, fewest peeled first); else the unique candidate name that ends
    with it after a module prefix (``buffer[m.bn.running_mean]``).
    """
    peeled: dict[str, list[tuple[int, str]]] = {}
    for name in cand:
        for depth, bare in enumerate(_unwrapped(name)[1:], start=1):
            peeled.setdefault(bare, []).append((depth, name))
    out = {}
    for name in ref:
        if name in cand:
            out[name] = name
            continue
        kind, _, inner = name.partition("[")
        if kind not in ("buffer", "grad") or not inner:
            continue
        hits = peeled.get(name, [])
        nearest = [c for depth, c in hits if depth == min(d for d, _ in hits)] if hits else []
        if len(nearest) == 1:
            out[name] = nearest[0]
            continue
        ends = [c for c in cand if c.startswith(kind + "[") and c.endswith("." + inner)]
        if len(ends) == 1:
            out[name] = ends[0]
    return out


def _unwrapped(name: str) -> list[str]:
    """``name`` and each name left as wrapper prefixes are peeled off its state path."""
    kind, _, inner = name.partition("[")
    if kind not in ("buffer", "grad") or not inner:
        return [name]
    out = [name]
    while prefix := next((p for p in WRAPPER_PREFIXES if inner.startswith(p)), None):
        inner = inner[len(prefix) :]
        out.append(f"{kind}[{inner}")
    return out


def judge_run(
    report: Report,
    judge: Judge,
    case: str,
    ref: Run,
    cand: Run,
    anchor: Run | None,
    *,
    group: str | None = None,
    against: Run | None = None,
    baselines: dict[str, Run] | None = None,
    ill_only: bool = False,
    witnesses: dict[str, Run] | None = None,
) -> None:
    """Compare ``cand`` with ``ref`` (or, for determinism, bitwise with ``against``).

    Anchored statistics go to the judge's pool under ``group``; no group, no anchored rule.
    ``baselines`` are the reference's runs in other layouts on the same inputs (by layout).
    ``ill_only``: the anchored rule judges only values ill-conditioned in this case (the stress
    draw); the others keep the elementwise check alone. ``witnesses``: eager's runs in other
    layouts on the same inputs (the special-values draw), for :func:`eager_disagrees`.
    """
    ref_vals, cand_vals = values(ref), values(cand)
    z_vals = values(anchor) if anchor is not None else {}
    other_vals = {layout: values(run) for layout, run in (baselines or {}).items()}
    prev = values(against) if against is not None else {}
    names = align(ref_vals, cand_vals)
    if against is None:
        _check_structure(report, case, ref.outputs, cand.outputs)
    for name in cand.not_differentiable if against is None else []:
        msg = "the reference's output is differentiable but the candidate's is not"
        report.add(Failure("error", "grad", name, case, msg))
    for name, expected in ref_vals.items():
        if name not in names:
            if expected is not None:
                _missing(report, name, case, [n for n in cand_vals if n.startswith("output")])
            continue
        actual = cand_vals[names[name]]
        if expected is None and actual is None:
            continue
        expected, actual = _zeros_for_none(expected, actual)
        if against is not None and judge.nondeterminism_allowed(expected) is False:
            compare_calls(report, name, case, prev.get(names[name]), actual)
            continue
        z = z_vals.get(name)
        anchored = group is not None and isinstance(z, torch.Tensor) and z.dtype == torch.float64
        budget = judge.budget(expected, anchored)
        anchor_value = z if anchored else None
        others = {layout: vals.get(name) for layout, vals in other_vals.items()}
        if witnesses and eager_disagrees(report, judge, name, case, expected, actual, witnesses):
            continue
        compare(
            report, name, case, expected, actual, budget, anchor_value,
            pool=judge.pool, group=group or "", baselines=others if anchored else None,
            ill_only=ill_only,
        )  # fmt: skip


def eager_disagrees(
    report: Report,
    judge: Judge,
    name: str,
    case: str,
    expected: Any,
    actual: Any,
    witnesses: dict[str, Run],
) -> bool:
    """True (noted) where eager's own value differs between its layouts on these inputs and the
    candidate's matches eager's in another layout, not in the case's own: eager gives no single
    answer there (its vectorized and scalar kernels part on NaN: hardtanh's backward drops the
    gradient at a NaN input in one and passes it in the other), and the candidate gave one of
    eager's. Judged elementwise (NaN and inf positions, tolerances); False otherwise, and the
    value is judged as every other."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return False
    budget = judge.budget(expected, anchored=False)

    def agree(e: Any, a: Any) -> bool:
        if not isinstance(e, torch.Tensor) or e.shape != a.shape or e.dtype != a.dtype:
            return False
        return compare(Report(), name, case, e, a, budget)

    if agree(expected, actual):
        return False
    for layout, run in witnesses.items():
        other = values(run).get(name)
        if not agree(expected, other) and agree(other, actual):
            report.note(
                f"{name} @ {case}: eager's own value differs in layout {layout} on these inputs "
                f"(NaN or inf taken another way); the candidate matches eager's there"
            )
            report.count("nonfinite (eager's other layout)")
            return True
    return False


def _check_structure(report: Report, case: str, ref: Any, cand: Any) -> None:
    """The outputs must nest alike: the same containers (a tuple is no list), keys and number of
    leaves, ``None`` where eager returns ``None``; an extra output is a failure too."""
    report.count("structure")
    expected, actual = skeleton(ref), skeleton(cand)
    if expected != actual:
        msg = f"the outputs nest differently: reference {expected}, candidate {actual}"
        report.add(Failure("error", "structure", "output", case, msg))


def _missing(report: Report, name: str, case: str, outputs: list[str]) -> None:
    if name.startswith("output"):
        msg = f"the candidate's outputs are shaped differently: {', '.join(outputs) or 'none'}"
        report.add(Failure("error", "structure", name, case, msg))
    else:
        msg = "the reference produced this value; the candidate has no counterpart"
        report.add(Failure("error", "missing", name, case, msg))


def _zeros_for_none(expected: Any, actual: Any) -> tuple[Any, Any]:
    # NOTE: an unused input or parameter has gradient None in one program and zeros in another;
    # both mean zero.
    if expected is None and isinstance(actual, torch.Tensor):
        return torch.zeros_like(actual), actual
    if actual is None and isinstance(expected, torch.Tensor):
        return expected, torch.zeros_like(expected)
    return expected, actual


def same_run(first: Run, second: Run) -> bool:
    """True when two runs of the reference agree bitwise everywhere."""
    a, b = values(first), values(second)
    if a.keys() != b.keys():
        return False
    for name, value in a.items():
        other = b[name]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
            if not identical(value, other):
                return False
        elif value is not None and other is not None and value != other:
            return False
    return True


def output_storages(result: Run) -> dict[str, set[int]]:
    out = {}
    for name, leaf in leaves(result.outputs, "output"):
        if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().nbytes() > 0:
            out[name] = {leaf.untyped_storage().data_ptr()}
    return out


def check_input_aliases(
    report: Report,
    case: str,
    ref: Run,
    cand: Run,
    state: tuple[set[int], set[int]] | None = None,
) -> None:
    """An output that aliases an input, or a parameter or buffer of its program's module (the
    storages ``state`` holds, the reference's and the candidate's), must do so in both
    programs: a write to one is visible in the other (an output that is a weight's memory where
    eager's is a copy lets the caller's write change the model)."""
    report.count("alias")
    ref_state, cand_state = state if state is not None else (set(), set())
    ref_out, cand_out = output_storages(ref), output_storages(cand)
    for what, ref_at, cand_at in (
        ("an input", ref.input_storages, cand.input_storages),
        ("a parameter or buffer", ref_state, cand_state),
    ):
        ref_alias = {n for n, s in ref_out.items() if s & ref_at}
        cand_alias = {n for n, s in cand_out.items() if s & cand_at}
        for name in sorted(cand_alias - ref_alias):
            msg = f"candidate output aliases {what}; the reference's does not"
            report.add(Failure("error", "alias", name, case, msg))
        for name in sorted(ref_alias - cand_alias):
            msg = f"reference output is a view of {what}; the candidate's is a copy"
            report.add(Failure("warning", "alias", name, case, msg))


def check_output_aliases(report: Report, case: str, ref: Run, cand: Run) -> None:
    """Two outputs that share memory must do so in both programs: a candidate that hands out one
    tensor for two of eager's (a common subexpression merged across outputs) changes the other
    output when the caller writes to one."""
    report.count("alias")
    ref_pairs, cand_pairs = overlapping_outputs(ref), overlapping_outputs(cand)
    for a, b in sorted(cand_pairs - ref_pairs):
        msg = f"candidate output shares memory with {b}; the reference's outputs do not"
        report.add(Failure("error", "alias", a, case, msg))
    for a, b in sorted(ref_pairs - cand_pairs):
        msg = f"reference output is a view of {b}; the candidate's are separate copies"
        report.add(Failure("warning", "alias", a, case, msg))


def overlapping_outputs(result: Run) -> set[tuple[str, str]]:
    """The pairs of output tensors (by name, in leaf order) whose elements share memory."""
    by_storage: dict[int, list[tuple[str, torch.Tensor]]] = {}
    for name, leaf in leaves(result.outputs, "output"):
        if isinstance(leaf, torch.Tensor) and leaf.numel() and leaf.untyped_storage().nbytes():
            by_storage.setdefault(leaf.untyped_storage().data_ptr(), []).append((name, leaf))
    pairs = set()
    for group in by_storage.values():
        for i, (a, ta) in enumerate(group):
            pairs |= {(a, b) for b, tb in group[i + 1 :] if _overlap(ta, tb)}
    return pairs


# NOTE: tensors spanning more elements than this are taken to overlap wherever their byte
# ranges do (their elements are not enumerated)
_ENUMERATED = 1 << 22


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one storage have an element in common (their byte ranges meet,
    and, where both are small, an element's bytes)."""
    ranges = [_byte_range(t) for t in (a, b)]
    if ranges[0][1] <= ranges[1][0] or ranges[1][1] <= ranges[0][0]:
        return False
    size = a.element_size()
    spans = [(hi - lo) // t.element_size() for (lo, hi), t in zip(ranges, (a, b), strict=True)]
    if b.element_size() != size or (ranges[0][0] - ranges[1][0]) % size or max(spans) > _ENUMERATED:
        return True
    found = [_element_offsets(t) + lo // size for (lo, _), t in zip(ranges, (a, b), strict=True)]
    return bool(torch.isin(found[0], found[1]).any())


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    start = int(t.storage_offset()) * t.element_size()
    last = sum((int(n) - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return start, start + (last + 1) * t.element_size()


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """Each element's offset in elements from the tensor's first (strides are never negative)."""
    span = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) + 1
    return torch.arange(span).as_strided(tuple(t.shape), t.stride()).reshape(-1)


def check_call_aliases(
    report: Report, case: str, ref: tuple[Run, Run], cand: tuple[Run, Run]
) -> None:
    """A second call must not hand back the first call's output storage (unless eager does)."""
    report.count("alias")
    ref_first, ref_second = output_storages(ref[0]), output_storages(ref[1])
    first, second = output_storages(cand[0]), output_storages(cand[1])
    shared_ref = {n for n, s in ref_second.items() if any(s & o for o in ref_first.values())}
    for name, storage in second.items():
        if name in shared_ref or not any(storage & o for o in first.values()):
            continue
        msg = "second call returned the storage of the first call's output (results overwritten)"
        report.add(Failure("error", "alias", name, case, msg))


def poison(result: Run, keep: set[int]) -> int:
    """Overwrite the run's output tensors with NaN (or the dtype's max), except those whose storage
    is in ``keep`` (module state, inputs). A later call that reuses or reads them shows it."""
    poisoned = 0
    for _, leaf in leaves(result.outputs, "output"):
        if not isinstance(leaf, torch.Tensor) or leaf.untyped_storage().data_ptr() in keep:
            continue
        if leaf.dtype == torch.bool:
            fill: float | bool = True
        elif leaf.dtype.is_floating_point or leaf.dtype.is_complex:
            fill = math.nan
        else:
            fill = float(torch.iinfo(leaf.dtype).max)
        try:
            with torch.no_grad():
                leaf.detach().fill_(fill)
            poisoned += 1
        except RuntimeError:
            continue  # NOTE: expanded (overlapping) outputs cannot be written; skip them.
    return poisoned

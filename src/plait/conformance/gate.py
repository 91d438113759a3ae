"""The gate: ``check(reference, candidate, inputs)`` judges a candidate against eager PyTorch.

Per case (a draw of inputs, in a layout, on a device) the gate runs the reference twice (to learn
whether eager itself is deterministic there), a float64 copy of the reference on the CPU (the
anchor), and the candidate twice: the first candidate call is judged against the reference, its
outputs are then poisoned with NaN, and the second call must reproduce the first bitwise (unless the
contract allows nondeterminism) without handing back the first call's storage.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

import plait.contract
from plait.conformance.artifact import (
    Context,
    NeedsAnotherSpecialization,
    contexts,
    ieee_problem,
    record_judged,
)
from plait.conformance.cases import (
    SPECIAL,
    STRESS,
    Inputs,
    alone,
    check_fresh,
    draw_cases,
    is_factory,
    more_draws,
)
from plait.conformance.draws import Args, Case, apply_layout, to_device, to_float64
from plait.conformance.judge import (
    Judge,
    check_call_aliases,
    check_input_aliases,
    check_output_aliases,
    judge_run,
    poison,
    same_run,
)
from plait.conformance.report import Failure, Report
from plait.conformance.runner import Program, Run, backward, ieee_float32, make_cotangents, run
from plait.conformance.tree import leaves, map_tensors
from plait.contract import Contract, loosened

_HALF = (torch.float32, torch.float16, torch.bfloat16)


def check(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs: Inputs,
    *,
    contract: Contract | None = None,
    grads: bool = False,
    draws: int = 3,
    layouts: Sequence[str] = ("contiguous",),
    devices: Sequence[str] | None = None,
    op_class: str = "model",
    reference_module: nn.Module | None = None,
    candidate_module: nn.Module | None = None,
    reference64: Callable[..., Any] | None = None,
    bitwise: bool = False,
    stress: float | None = 100.0,
    special_values: bool = True,
    seed: int = 0,
    precision: torch.dtype | None = None,
) -> Report:
    """Judge ``candidate`` against ``reference`` under the numerical contract; return a Report.

    ``inputs`` is a tuple of example arguments (fresh draws copy their shapes, dtypes and devices;
    the example itself is one more case) or a ``factory(seed) -> arguments``. ``draws`` fresh
    draws are always judged, plus one ``stress`` draw with float inputs scaled by ``stress``, one
    special-values draw with NaN, +inf, -inf, -0.0 and +0.0 written into a few random positions
    of every floating-point input (``special_values=False`` skips it; judged where eager runs on
    it: if eager raises there, that is noted, not failed), and
    more fresh draws while a value pools fewer than ``MIN_SAMPLES`` error samples (at most
    ``MAX_ADDED_DRAWS``; the report notes them, and a value still short).
    Module state: a ``nn.Module`` reference/candidate is its own module; a plain callable names its
    module with ``reference_module``/``candidate_module`` (the same object when the candidate
    wraps the reference's module). ``reference64`` overrides the float64 anchor, which is otherwise
    a float64 deep copy of a module reference, or the reference function called on float64 inputs.
    ``bitwise=True`` declares that the candidate keeps the order of arithmetic. ``precision``
    names the floating dtype the reference computes in when its results are wider (under
    ``torch.autocast(dtype=torch.bfloat16)``: ``precision=torch.bfloat16``): wider values are
    judged by that dtype's rows. ``devices``
    defaults to where the inputs live; ``"cuda"`` is skipped, with a note, where there is none.

    Example:
        >>> import torch, plait.conformance
        >>> model = torch.nn.Linear(4, 3)
        >>> report = plait.conformance.check(model, model, (torch.randn(2, 4),), grads=True)
        >>> report.ok
        True
    """
    if draws < 1:
        raise ValueError("draws must be >= 1: the gate never judges on the example alone")
    contract = contract if contract is not None else plait.contract.load()
    contract.tolerance(op_class, "float32")  # NOTE: raises on an unknown op class.
    report = Report(contract_version=contract.version)
    _audit(contract, report)
    judge = Judge(contract, op_class, bitwise, precision=precision)
    ref, cand = Program.of(reference, reference_module), Program.of(candidate, candidate_module)
    if ref.initial and cand.module is None:
        msg = "the reference has buffers; the candidate's module is unknown: pass candidate_module="
        report.add(Failure("error", "setup", "buffers", "all cases", msg))
    anchor = _Anchor.build(reference, ref, reference64, report)
    cases = draw_cases(inputs, draws, stress, special_values, seed, report)
    on = _devices(devices, cases, report)
    # NOTE: a compiled candidate is judged as its users' calls run it: per group of their
    # settings, every case under those settings, pinned to their specializations (made, when
    # there is no user call yet, under the caller's settings: outside ieee_float32)
    judged = contexts(candidate, cases[0][1], grads, report)
    refused: set[tuple[int, str | None]] = set()  # NOTE: (context, device) judging cannot run

    def judge_cases(some: list[tuple[str, Args]], first_seed: int) -> None:
        for context in judged:
            with context.enter():
                for device in on:
                    if (id(context), device) in refused:
                        continue  # NOTE: reported once, on the first draws
                    if not _check_device(report, judge, context, device, some, layouts, ref,
                                         cand, anchor, first_seed):  # fmt: skip
                        refused.add((id(context), device))

    try:
        with ieee_float32():
            judge_cases(cases, seed)
            fresh = [c for c in cases if not alone(c[0])]
            added = 0
            while True:
                more = min(_thin_values(judge, report), MAX_ADDED_DRAWS - added)
                if more <= 0:
                    break
                extra = more_draws(inputs, cases, draws + added, more, seed)
                if is_factory(inputs):
                    check_fresh(fresh + extra, report, first_new=len(fresh))
                fresh += extra
                judge_cases(extra, seed + len(cases) + added)
                added += more
            _note_still_thin(judge, report, added)
        judge.pool.finalize(report)
    finally:
        ref.reset()
        cand.reset()
    record_judged(judged, report)
    return report


def _check_device(
    report: Report,
    judge: Judge,
    context: Context,
    device: str | None,
    cases: list[tuple[str, Args]],
    layouts: Sequence[str],
    ref: Program,
    cand: Program,
    anchor: _Anchor,
    seed: int,
) -> bool:
    """Every case on ``device`` (every layout), the candidate called as ``context`` says;
    False where the context's settings cannot be judged (reported)."""
    problem = ieee_problem(context.settings, _on_cuda(device, cases))
    if problem is not None:
        msg = (
            f"the user's calls ran with {problem}: the contract judges IEEE float32, which "
            "would need a specialization those calls never ran"
        )
        where = context.label or "all cases"
        report.add(Failure("error", "specialization", "settings", where, msg))
        return False
    pinned = Program(context.call, cand.module, cand.initial)
    with _on_device([ref.module, cand.module], device):
        for index, (label, args) in enumerate(cases):
            if context.label is not None:
                label = f"{label}, {context.label}"
            for layout in layouts:
                laid, changed = apply_layout(to_device(args, device), layout)
                if layout != "contiguous" and not changed:
                    report.note(f"layout {layout}: no 4-D/5-D float input, skipped")
                    continue
                case = Case(label, laid, layout, device)
                _check_case(report, judge, case, ref, pinned, anchor, context.grads, seed + index,
                            context.label, context.input_grads)  # fmt: skip
    return True


def _on_cuda(device: str | None, cases: list[tuple[str, Args]]) -> bool:
    if device is not None:
        return torch.device(device).type == "cuda"
    return any(
        isinstance(t, torch.Tensor) and t.is_cuda
        for _, args in cases
        for _, t in leaves(args, "input")
    )


def _check_case(
    report: Report,
    judge: Judge,
    case: Case,
    ref: Program,
    cand: Program,
    anchor: _Anchor,
    grads: bool,
    seed: int,
    context: str | None = None,
    input_grads: bool | None = None,
) -> None:
    label, cuda = str(case), _uses_cuda(case)
    r1 = run(ref, case.args, rng_seed=seed, grads=grads, input_grads=input_grads, cuda=cuda)
    if r1.error is not None and case.label.startswith(SPECIAL):
        report.note(f"{label}: the reference raised {r1.error!r} on NaN/inf inputs: not judged")
        return
    if r1.error is not None:
        msg = f"the reference raised {r1.error!r}: these inputs are outside its domain"
        report.add(Failure("error", "setup", "reference", label, msg))
        return
    cot = make_cotangents(r1.outputs, seed) if grads else {}
    if grads and not cot:
        report.note(f"{label}: grads asked for, but no output of the reference is differentiable")
    _backward(r1, ref, cot, grads)
    r2 = run(ref, case.args, rng_seed=seed, grads=grads, input_grads=input_grads, cuda=cuda)
    _backward(r2, ref, cot, grads)
    # NOTE: the stress draw is anchored too, in a group of its own (its scale is not the other
    # draws'), where the anchored rule judges only what is ill-conditioned there: at x100 a
    # network may amplify rounding beyond the elementwise budget (MobileNetV3's squeeze-excite
    # gates, hardsigmoid of a sum of terms ~1e4 that lands in [-3, 3]), and eager is then no
    # witness within it, not even against itself in another layout. So is the special-values
    # draw (its finite values are judged as the other draws', its NaN and inf by position)
    one_off = (STRESS if case.label.startswith(STRESS) else SPECIAL) if alone(case.label) else None
    z = anchor.run(case.args, r1, seed, cot, grads, report, input_grads, one_off)
    group = f"layout {case.layout}, device {case.device_name}"
    group = f"{one_off}, {group}" if one_off else group
    if context is not None:
        group = f"{group}, {context}"
    baseline = z is not None or one_off == SPECIAL  # NOTE: eager's NaN paths vary by layout
    others = _baseline_runs(judge, case, ref, seed, cot, grads, input_grads) if baseline else {}
    first = run(cand, case.args, rng_seed=seed, grads=grads, input_grads=input_grads, cuda=cuda)
    _backward(first, cand, cot, grads)
    if _raised(report, first, label, "first call"):
        return
    witnesses = others if one_off == SPECIAL else None
    judge_run(report, judge, label, r1, first, z, group=group, baselines=others,
              ill_only=one_off is not None, witnesses=witnesses)  # fmt: skip
    check_input_aliases(report, label, r1, first, (ref.storages(), cand.storages()))
    if ref.aliases_known:
        check_output_aliases(report, label, r1, first)
    snapshot = _snapshot(first)
    poison(first, ref.storages() | cand.storages() | first.input_storages)
    second = run(cand, case.args, rng_seed=seed, grads=grads, input_grads=input_grads, cuda=cuda)
    _backward(second, cand, cot, grads)
    if _raised(report, second, label, "second call"):
        return
    check_call_aliases(report, label, (r1, r2), (first, second))

    def again() -> Run:
        r = run(ref, case.args, rng_seed=seed, grads=grads, input_grads=input_grads, cuda=cuda)
        _backward(r, ref, cot, grads)
        return r

    if _deterministic(r1, r2, snapshot, second, again):
        judge_run(report, judge, label + ", call 2", r1, second, z, against=snapshot)
    else:
        report.note(f"{label}: eager is itself nondeterministic here; call 2 judged by tolerance")
        judge_run(report, judge, label + ", call 2", r1, second, z)


def _baseline_runs(
    judge: Judge,
    case: Case,
    ref: Program,
    seed: int,
    cot: dict[str, torch.Tensor],
    grads: bool,
    input_grads: bool | None,
) -> dict[str, Run]:
    """Eager on the same inputs in each of the contract's baseline layouts other than the case's
    own (where the layout changes an input): PyTorch picks other kernels there, of other accuracy,
    and the model rule's baseline is the least accurate of them."""
    out = {}
    for layout in judge.contract.baseline_layouts:
        if layout == case.layout:
            continue
        args, _ = apply_layout(case.args, layout)
        if not _restrided(case.args, args):
            continue
        result = run(
            ref, args, rng_seed=seed, grads=grads, input_grads=input_grads, cuda=_uses_cuda(case)
        )
        _backward(result, ref, cot, grads)
        if result.error is None:
            out[layout] = result
    return out


def _restrided(before: Args, after: Args) -> bool:
    old, new = leaves(before, "input"), leaves(after, "input")
    return any(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.stride() != b.stride()
        for (_, a), (_, b) in zip(old, new, strict=True)
    )


def _backward(result: Run, program: Program, cot: dict[str, torch.Tensor], grads: bool) -> None:
    if grads and result.error is None:
        backward(result, program, cot)


def _raised(report: Report, result: Run, label: str, which: str) -> bool:
    if result.error is None:
        return False
    if isinstance(result.error, NeedsAnotherSpecialization):
        report.add(Failure("error", "specialization", "candidate", label, str(result.error)))
        return True
    msg = f"candidate {which} raised {type(result.error).__name__}: {result.error}"
    report.add(Failure("error", "exception", "candidate", label, msg))
    return True


# NOTE: eager runs made again before a candidate's differing second call is judged bitwise
CONFIRM_RUNS = 3


def _deterministic(r1: Run, r2: Run, first: Run, second: Run, again: Callable[[], Run]) -> bool:
    """Whether eager is deterministic on this case, as far as runs show: its two runs agree
    bitwise and, where the candidate's two calls do not, so do ``CONFIRM_RUNS`` more (a pair
    that agrees proves little where eager's kernels accumulate with atomics, CUDA's attention
    backward: the candidate calling those kernels would fail only by chance)."""
    if not same_run(r1, r2):
        return False
    if same_run(first, second):
        return True
    return all(same_run(r1, again()) for _ in range(CONFIRM_RUNS))


def _snapshot(result: Run) -> Run:
    def keep(t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone()

    return Run(
        outputs=map_tensors(keep, result.outputs),
        buffers=dict(result.buffers),
        inputs_after=result.inputs_after,
        grads=dict(result.grads),
    )


class _Anchor:
    """The float64 reference on the CPU, or the reason there is none."""

    def __init__(self, program: Program | None, trial: bool) -> None:
        self.program, self.trial = program, trial

    @classmethod
    def build(
        cls,
        reference: Callable[..., Any],
        ref: Program,
        reference64: Callable[..., Any] | None,
        report: Report,
    ) -> _Anchor:
        if reference64 is not None:
            return cls(Program.of(reference64, None), trial=False)
        if isinstance(reference, nn.Module):
            try:
                wide = copy.deepcopy(reference).cpu().double()
            except Exception as exc:
                report.note(f"float64 anchor unavailable: cannot copy the reference ({exc!r})")
                return cls(None, trial=False)
            return cls(Program.of(wide, None), trial=False)
        # NOTE: a plain function: try it on float64 inputs; it may close over float32 weights.
        return cls(Program(reference, ref.module, ref.initial), trial=True)

    def run(
        self,
        args: Args,
        eager: Run,
        seed: int,
        cot: dict[str, torch.Tensor],
        grads: bool,
        report: Report,
        input_grads: bool | None = None,
        one_off: str | None = None,
    ) -> Run | None:
        if self.program is None or not _needs_anchor(eager):
            if self.program is not None and _complex64(eager):
                report.note("complex64 results: judged by float32 tolerances alone (no anchor)")
            elif self.program is not None:
                report.note("reference computes in float64: judged by float64 tolerances alone")
            return None
        result = run(
            self.program,
            to_float64(args),
            rng_seed=seed,
            grads=grads,
            input_grads=input_grads,
            cuda=False,
        )
        if grads and result.error is None:
            backward(result, self.program, {k: v.double() for k, v in cot.items()})
        problem = _anchor_problem(result, eager)
        if problem is None:
            return result
        if one_off:  # NOTE: large or special inputs only: the other cases keep their anchor
            report.note(
                f"float64 anchor unavailable in the {one_off} ({problem}): values there are "
                "judged by op-class tolerances alone"
            )
            return None
        report.note(
            f"float64 anchor unavailable ({problem}); the model rule was not applied and "
            "values are judged by op-class tolerances alone: pass reference64= to anchor them"
        )
        self.program = None
        return None


def _needs_anchor(eager: Run) -> bool:
    return any(
        isinstance(v, torch.Tensor) and v.dtype in _HALF for _, v in leaves(eager.outputs, "output")
    )


def _complex64(eager: Run) -> bool:
    return any(
        isinstance(v, torch.Tensor) and v.dtype == torch.complex64
        for _, v in leaves(eager.outputs, "output")
    )


def _anchor_problem(result: Run, eager: Run) -> str | None:
    if result.error is not None:
        return f"the reference raised {type(result.error).__name__} in float64: {result.error}"
    wide = dict(leaves(result.outputs, "output"))
    for name, value in leaves(eager.outputs, "output"):
        if isinstance(value, torch.Tensor) and value.dtype in _HALF:
            got = wide.get(name)
            if not isinstance(got, torch.Tensor) or got.dtype != torch.float64:
                return f"{name} is not float64 when the inputs are"
    return None


# NOTE: the model rule compares RMS errors; on fewer pooled samples than this the ratio of two
# equally accurate programs' errors passes the factor too often (docs/conformance.md, "Statistics")
MIN_SAMPLES = 4
# NOTE: the most draws the gate adds for it: a value finite on few draws (a log of a sum that is
# negative on most) would otherwise be drawn for without end; one still short is noted
MAX_ADDED_DRAWS = 2 * MIN_SAMPLES


def _short(judge: Judge) -> Iterator[tuple[str, str, int, int]]:
    """(where, group, samples, cases) of each pooled value, outside the stress and special-values
    draws (judged alone), with fewer than ``MIN_SAMPLES`` error samples over at least one case."""
    for where, group, samples, cases in judge.pool.samples():
        if not alone(group) and samples < MIN_SAMPLES and cases:
            yield where, group, samples, cases


def _thin_values(judge: Judge, report: Report) -> int:
    """How many more draws bring every pooled value (outside the draws judged alone) to
    ``MIN_SAMPLES`` error samples: a 0-d loss or a cancelling sum has one per draw."""
    more = 0
    for where, group, samples, cases in _short(judge):
        need = -(-(MIN_SAMPLES - samples) * cases // samples)
        if need > more:
            more = need
            report.note(
                f"{where} ({group}) pooled {samples} error sample(s) over {cases} case(s), fewer "
                f"than the {MIN_SAMPLES} the model rule needs: {need} more draw(s) judged"
            )
    return more


def _note_still_thin(judge: Judge, report: Report, added: int) -> None:
    """Say how many draws were added, and which values they left short of ``MIN_SAMPLES`` (not
    finite on most draws): the model rule judges them on what they pooled."""
    if added:
        report.note(f"{added} draw(s) added in all, for values short of {MIN_SAMPLES} samples")
    for where, group, samples, cases in _short(judge):
        report.note(
            f"{where} ({group}) pooled {samples} error sample(s) over {cases} case(s) after "
            f"{added} added draw(s) (at most {MAX_ADDED_DRAWS}), fewer than the {MIN_SAMPLES} "
            "the model rule needs: judged on those"
        )


def _devices(
    devices: Sequence[str] | None, cases: list[tuple[str, Args]], report: Report
) -> list[str | None]:
    if devices is None:
        return [None]
    out: list[str | None] = []
    for device in devices:
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            report.note(f"device {device} skipped: CUDA is not available on this machine")
            continue
        out.append(device)
    if not out:
        report.note("no requested device is available: nothing was run")
        report.add(Failure("error", "setup", "devices", "all cases", "no device to run on"))
    return out


@contextlib.contextmanager
def _on_device(modules: list[nn.Module | None], device: str | None) -> Iterator[None]:
    """Move the modules to ``device`` for the cases there, and back afterwards."""
    moved: list[tuple[nn.Module, torch.device]] = []
    seen: set[int] = set()
    for module in modules:
        if device is None or module is None or id(module) in seen:
            continue
        seen.add(id(module))
        first = next(iter(list(module.parameters()) + list(module.buffers())), None)
        if first is not None and first.device != torch.device(device):
            moved.append((module, first.device))
            module.to(device)
    try:
        yield
    finally:
        for module, original in moved:
            module.to(original)


def _uses_cuda(case: Case) -> bool:
    if case.device is not None:
        return torch.device(case.device).type == "cuda"
    return any(isinstance(t, torch.Tensor) and t.is_cuda for _, t in leaves(case.args, "input"))


def _audit(contract: Contract, report: Report) -> None:
    """A contract looser than the shipped default is allowed, but never silently."""
    shipped = plait.contract.load()
    if contract is shipped or contract.data == shipped.data:
        return
    for change in loosened(shipped, contract):
        msg = f"contract looser than the shipped default: {change}"
        report.add(Failure("warning", "contract", change.key, "all cases", msg))

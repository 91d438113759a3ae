"""``bisect``: from "the compiled program is wrong" to the first pass and node that made it so.

It compiles as :func:`plait.compile` would (the same options), judges the result with the
conformance gate and, when the gate fails:

1. judges the captured graph run by the reference interpreter (a failure there is capture's);
2. replays the pass pipeline one pass at a time and judges each pass's output graph, run by the
   reference interpreter, with the gate: the first pass that fails is the culprit (passes that
   changed nothing are skipped: their output is their input);
3. inside that pass's output, finds the first value that diverges from the pass's input graph
   (:func:`plait.diagnose.replay.localize_pass`), and the rewrite rule the pass's record names
   for it; or, when every pass is clean, the first node the Stax program computes wrong
   (:func:`plait.diagnose.backend.localize_backend`);
4. shrinks the graph around that value (:func:`plait.diagnose.shrink.shrink`) and writes a
   standalone repro (:func:`plait.diagnose.reproducer.write_repro`).

The diagnosis runs under ``torch.no_grad()`` (the forward program); a pass registered by the
user is named exactly as a built-in one.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import plait.conformance
from plait.api import compile as plait_compile
from plait.conformance.cases import SPECIAL_SEED
from plait.conformance.draws import stressed, with_special_values
from plait.conformance.report import Report
from plait.diagnose.backend import localize_backend
from plait.diagnose.judging import Executor, Measure, first_measure, graph_executor
from plait.diagnose.replay import (
    Divergence,
    PassFailure,
    PassStep,
    localize_pass,
    raised,
    replay,
    same_failure,
)
from plait.diagnose.reproducer import backend_divergence, pass_divergence, write_repro
from plait.diagnose.shrink import shrink
from plait.diagnose.values import evaluate
from plait.errors import (
    GraphCaptureError,
    NumericsError,
    PlaitCompileError,
    SemanticDriftError,
)
from plait.guards.guard import GuardEnv
from plait.ir import Graph, Value
from plait.runtime import StaxOptions


def expand_pipeline(pipeline: str) -> str:
    """``pipeline`` with ``inference`` and ``training`` standing for the default pipelines.

    Example:
        >>> expand_pipeline("inference,my-pass").endswith(",dce,my-pass")
        True
    """
    from plait.passes import INFERENCE_PIPELINE, TRAINING_PIPELINE

    named = {"inference": INFERENCE_PIPELINE, "training": TRAINING_PIPELINE}
    return ",".join(named.get(p.strip(), p.strip()) for p in pipeline.split(",") if p.strip())


@dataclass
class NodeReport:
    """The node a diagnosis blames: its ``id``, its IR ``text``, the ``graph`` it is in
    (``after <pass>``, ``before <pass>`` for a node a rewrite replaced, ``program`` for the
    backend), the fused ``kernel`` it ran in and what was ``replaced`` (IR text)."""

    id: int
    text: str
    graph: str
    kernel: str | None = None
    replaced: str | None = None
    note: str = ""

    def __str__(self) -> str:
        parts = [f"node {self.id} ({self.graph}): {self.text}"]
        if self.replaced and self.replaced != self.text:
            parts.append(f"replacing: {self.replaced}")
        if self.kernel:
            parts.append(f"ran in: {self.kernel}")
        if self.note:
            parts.append(self.note)
        return "\n    ".join(parts)


@dataclass
class Bisection:
    """A diagnosis. ``ok``: the gate passed (nothing to find). Otherwise ``stage`` is
    ``"capture"``, ``"pass"`` or ``"backend"``; ``pass_name`` the first divergent pass;
    ``node`` the first divergent node; ``rule`` the rewrite rule the pass's record names for it;
    ``error`` the gate's measure against its budget (for the node when one was found, else for
    the stage); ``repro`` the repro directory (None when no standalone repro could be made:
    ``notes`` say why)."""

    ok: bool
    stage: str | None = None
    pass_name: str | None = None
    node: NodeReport | None = None
    rule: str | None = None
    error: Measure | None = None
    repro: Path | None = None
    stage_error: Measure | None = None
    pipeline: list[str] = field(default_factory=list)
    report: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def error_code(self) -> str | None:
        """The failure taxonomy's code (docs/errors.md) for what was found: ``PLAIT-D200`` for
        a pass the verifier rejects, ``PLAIT-C100`` for a stage that raised, ``PLAIT-N300`` for
        values outside the contract; None when the gate passed."""
        if self.ok:
            return None
        check = self.error.check if self.error is not None else ""
        if check == "verify":
            return SemanticDriftError.error_code
        if check == "exception":
            return PlaitCompileError.error_code
        return NumericsError.error_code

    def raise_if_failed(self) -> None:
        """Raise this diagnosis as its taxonomy type (:class:`~plait.errors.NumericsError`,
        :class:`~plait.errors.SemanticDriftError` or :class:`~plait.errors.PlaitCompileError`);
        nothing when the gate passed."""
        code = self.error_code
        if code is None:
            return
        if code == SemanticDriftError.error_code:
            node = self.node.id if self.node is not None else None
            raise SemanticDriftError(self.pass_name or "?", str(self), node)
        if code == PlaitCompileError.error_code:
            raise PlaitCompileError(str(self))
        raise NumericsError(str(self), self)

    def __str__(self) -> str:
        if self.ok:
            return "plait diagnose: the compiled program passes the conformance gate"
        where = {"pass": f"pass {self.pass_name!r}", "backend": "the Stax backend"}
        stage = where.get(self.stage or "", self.stage)
        lines = [f"plait diagnose [{self.error_code}]: first divergence in {stage}"]
        if self.rule:
            lines.append(f"  rule: {self.rule}")
        if self.node is not None:
            lines.append(f"  {self.node}")
        if self.error is not None:
            lines.append(f"  error: {self.error}")
        if self.stage_error is not None and self.stage_error != self.error:
            lines.append(f"  gate: {self.stage_error}")
        if self.repro is not None:
            lines.append(f"  repro: {self.repro} (python {self.repro / 'repro.py'})")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class Subject:
    """What is diagnosed: the captured graph, the pipeline and its frozen parameters, the Stax
    options, and how a candidate graph is judged (``judge``) and fed (``sample``)."""

    graph: Graph
    pipeline: list[str]
    params: dict[str, Any]
    stax: StaxOptions | None
    judge: Callable[[Executor], Report]
    sample: Callable[[int], dict[str, Any]]
    samples: int = 4  # NOTE: how many input sets ``sample`` makes (localization tries each)


def diagnose_subject(
    subject: Subject, *, repro_dir: str | Path | None = None,
    shrink_seconds: float = 60.0, stage_report: Report | None = None,
) -> Bisection:  # fmt: skip
    """Steps 1-4 of the module docstring on a subject whose compiled program failed the gate."""
    clock: dict[str, float] = {}
    out = Bisection(False, pipeline=list(subject.pipeline))
    t0 = time.perf_counter()
    g0 = subject.graph
    try:
        steps = replay(g0, subject.pipeline, subject.params)
    except PassFailure as failure:
        _pass_raised(out, failure, subject, repro_dir, shrink_seconds)
        out.seconds = {"replay": time.perf_counter() - t0}
        return out
    clock["replay"] = time.perf_counter() - t0
    failing, verdict = _first_failing_pass(subject, steps)
    clock["passes"] = time.perf_counter() - t0 - clock["replay"]
    if verdict is not None and failing is None:
        out.stage, out.stage_error, out.report = "capture", first_measure(verdict), str(verdict)
        out.error = out.stage_error
        out.notes.append("the captured graph, run by the reference interpreter, already fails")
        return out
    if verdict is not None:
        out.stage_error, out.report = first_measure(verdict), str(verdict)
    if failing is not None:
        out.stage, out.pass_name = "pass", failing.name
        step = failing
        found, inputs = _on_samples(subject, lambda i: localize_pass(step, i))
        _blame(out, found, f"after {failing.name}", f"before {failing.name}")
        clock["localize"] = time.perf_counter() - t0 - sum(clock.values())
        if found is not None and found.exceeded:
            out.repro = _pass_repro(failing, inputs, found, repro_dir, shrink_seconds)
        clock["repro"] = time.perf_counter() - t0 - sum(clock.values())
        out.seconds = clock
        return out
    out.stage = "backend"
    if stage_report is not None:
        out.stage_error, out.report = first_measure(stage_report), str(stage_report)
    if subject.stax is None:
        out.notes.append("every pass is clean and the program did not run on Stax")
        return out
    final, stax = steps[-1].after if steps else g0, subject.stax
    found, inputs = _on_samples(subject, lambda i: localize_backend(final, stax, _for(final, i)))
    _blame(out, found, "program", "program")
    clock["localize"] = time.perf_counter() - t0 - sum(clock.values())
    if found is not None and found.exceeded:
        out.repro = _backend_repro(final, _for(final, inputs), found, subject.stax, repro_dir,
                                   shrink_seconds)  # fmt: skip
    clock["repro"] = time.perf_counter() - t0 - sum(clock.values())
    out.seconds = clock
    return out


# NOTE: the stress factor of bisect's gate, its stage judgments and its last diagnosis inputs
STRESS = 100.0


def _on_samples(
    subject: Subject, localize: Callable[[dict[str, Any]], Divergence | None]
) -> tuple[Divergence | None, dict[str, Any]]:
    """Localize on each of the subject's input sets in turn until a value breaks its budget;
    else the closest found, with the inputs it was found on."""
    best: tuple[Divergence | None, dict[str, Any]] | None = None
    for k in range(subject.samples):
        inputs = subject.sample(k)
        found = localize(inputs)
        if found is not None and found.exceeded:
            return found, inputs
        if best is None or (found is not None and (best[0] is None or found.share > best[0].share)):
            best = (found, inputs)
    assert best is not None
    return best


def _pass_raised(
    out: Bisection, failure: PassFailure, subject: Subject, repro_dir: str | Path | None,
    seconds: float,
) -> None:  # fmt: skip
    """A pass raised (or the verifier rejected its output): the pass is the stage, the
    exception the measure; the repro shrinks its input graph while the pass still raises so."""
    exc = failure.error
    out.stage, out.pass_name = "pass", failure.name
    if isinstance(exc, SemanticDriftError):
        out.error = Measure("verify", f"node {exc.node_id}", "after the pass", str(exc))
        out.notes.append("the IR verifier rejects the pass's output (semantic drift)")
        nodes = [n for n in failure.graph.nodes if n.id == exc.node_id]
        if nodes:
            out.node = NodeReport(nodes[0].id, _line(nodes[0]), f"before {failure.name}")
    else:
        out.error = raised(exc, graph="before").measure
        out.notes.append(f"pass {failure.name!r} raised instead of returning a graph")
    out.stage_error = out.error
    inputs = _for(failure.graph, subject.sample(0))
    values = evaluate(failure.graph, inputs)
    first = raised(exc, graph="before")

    def still(g: Graph, i: dict[str, Any]) -> bool:
        return same_failure(first, pass_divergence(g, i, failure.name))

    outputs = [o.name for o in failure.graph.outputs if isinstance(o, Value)]
    small = shrink(failure.graph, values, outputs[0] if outputs else "", still, seconds=seconds)
    out.repro = write_repro(_repro_dir(repro_dir), small.graph, small.inputs, stage="pass",
                            pass_name=failure.name, found=_found_record(first))  # fmt: skip


def _first_failing_pass(
    subject: Subject, steps: list[PassStep]
) -> tuple[PassStep | None, Report | None]:
    """The first pass whose output, run by the interpreter, fails the gate, with the gate's
    report; ``(None, report)`` when the captured graph itself fails; ``(None, None)`` when the
    pipeline's output passes (the backend is to blame).

    The pipeline's output is judged first: when it passes, no pass is judged on its own.
    Otherwise the passes that changed the graph are bisected: the output of the middle one is
    judged, and the search goes on in the half where the verdict turns from pass to fail (a
    divergence, once made, is assumed to persist: a later pass that cancelled an earlier one's
    divergence would hide it). ``log2`` of the changed passes' count gate calls, not one each."""
    g0 = subject.graph
    changed = [s for s in steps if s.record.changed]

    def judge(graph: Graph) -> Report:
        return subject.judge(graph_executor(g0.inputs, graph))

    if not changed:
        report = judge(g0)
        return None, None if report.ok else report
    verdicts = {len(changed) - 1: judge(changed[-1].after)}
    if verdicts[len(changed) - 1].ok:
        return None, None
    passing, failing = -1, len(changed) - 1  # NOTE: -1 stands for the captured graph
    while failing - passing > 1:
        middle = (passing + failing) // 2
        verdicts[middle] = judge(changed[middle].after)
        if verdicts[middle].ok:
            passing = middle
        else:
            failing = middle
    if passing == -1:
        captured = judge(g0)
        if not captured.ok:
            return None, captured
    return changed[failing], verdicts[failing]


def _for(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Values for ``graph``'s inputs: the sample's, else the graph's constants."""
    return {
        v.name: inputs[v.name] if v.name in inputs else graph.constants[v.name]
        for v in graph.inputs
    }


def _blame(out: Bisection, found: Divergence | None, after: str, before: str) -> None:
    if found is None:
        out.notes.append("no value differs on the diagnosis inputs (the gate's draws differ)")
        out.error = out.stage_error
        return
    out.error, out.rule = found.measure, found.rule
    if found.node is not None:
        replaced = found.replaced
        out.node = NodeReport(
            found.node.id, found.node_line(), after if found.graph in ("after", "program")
            else before, found.kernel,
            None if replaced is None else _line(replaced), found.note,
        )  # fmt: skip
    if not found.exceeded:
        anchored = out.stage_error is not None and out.stage_error.check == "anchored"
        why = (
            "the gate judged the whole program by the float64-anchored model rule"
            if anchored
            else "the gate's failing case is not among the diagnosis inputs"
        )
        out.notes.append(
            "no single value breaks its op-class row on the diagnosis inputs; the node shown "
            f"came closest ({why})"
        )


def _line(node: Any) -> str:
    from plait.ir.text import node_text

    return node_text(node, lambda v: v.name)


def _repro_dir(repro_dir: str | Path | None) -> Path:
    if repro_dir is not None:
        return Path(repro_dir)
    return Path(tempfile.mkdtemp(prefix="plait-repro-"))


def _found_record(found: Divergence) -> dict[str, Any]:
    return {
        "value": found.value, "node": found.node_line(), "rule": found.rule,
        "kernel": found.kernel, "measure": found.measure.to_json(),
    }  # fmt: skip


def _pass_repro(
    step: PassStep, inputs: Mapping[str, Any], found: Divergence,
    repro_dir: str | Path | None, seconds: float,
) -> Path:  # fmt: skip
    values = evaluate(step.before, _for(step.before, inputs))

    def still(g: Graph, i: dict[str, Any]) -> bool:
        return same_failure(found, pass_divergence(g, i, step.name))

    small = shrink(step.before, values, found.value, still, seconds=seconds)
    return write_repro(_repro_dir(repro_dir), small.graph, small.inputs, stage="pass",
                       pass_name=step.name, found=_found_record(found))  # fmt: skip


def _backend_repro(
    graph: Graph, inputs: Mapping[str, Any], found: Divergence, stax: StaxOptions,
    repro_dir: str | Path | None, seconds: float,
) -> Path:  # fmt: skip
    values = evaluate(graph, inputs)
    options = stax.record()

    def still(g: Graph, i: dict[str, Any]) -> bool:
        return same_failure(found, backend_divergence(g, i, options))

    small = shrink(graph, values, found.value, still, seconds=seconds)
    return write_repro(_repro_dir(repro_dir), small.graph, small.inputs, stage="backend",
                       stax=options, found=_found_record(found))  # fmt: skip


# --- a user's model or function --------------------------------------------------------------
def bisect(
    model_or_fn: Any,
    args: Any,
    kwargs: dict[str, Any] | None = None,
    *,
    options: dict[str, Any] | None = None,
    repro_dir: str | Path | None = None,
    draws: int = 2,
    seed: int = 0,
    shrink_seconds: float = 60.0,
) -> Bisection:
    """Compile ``model_or_fn`` as ``plait.compile(model_or_fn, options=options)`` would, judge
    it with the conformance gate on ``args`` (and ``draws`` fresh draws like them), and when it
    fails find the first divergent pass and node and write a repro (to ``repro_dir``, else a
    fresh temporary directory). ``options`` defaults ``cache`` to False (the compile itself is
    diagnosed, not a cache entry).

    Example:
        >>> import torch, plait.diagnose
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
        >>> result = plait.diagnose.bisect(model, (torch.randn(2, 8),))
        >>> result.ok, result.stage
        (True, None)
    """
    opts = {"cache": False, **(options or {})}
    if isinstance(opts.get("passes"), str):
        opts["passes"] = expand_pipeline(opts["passes"])
    call_args = (
        args if isinstance(args, tuple) else tuple(args) if isinstance(args, list) else (args,)
    )
    kw = dict(kwargs or {})
    module = model_or_fn if isinstance(model_or_fn, nn.Module) else None
    start = time.perf_counter()
    compiled = plait_compile(model_or_fn, options=opts)
    with torch.no_grad():
        try:
            compiled(*call_args, **kw)
        except SemanticDriftError as exc:
            measure = Measure("verify", f"node {exc.node_id}", "compile", str(exc))
            return Bisection(
                False,
                "pass",
                exc.pass_name,
                error=measure,
                stage_error=measure,
                notes=["the IR verifier rejects the pass's output (semantic drift)"],
            )
        except (PlaitCompileError, GraphCaptureError) as exc:
            stage = "capture" if isinstance(exc, GraphCaptureError) else "backend"
            measure = Measure("exception", type(exc).__name__, "compile", str(exc))
            return Bisection(
                False,
                stage,
                error=measure,
                stage_error=measure,
                notes=["the compile raised; there is no program to judge"],
            )
        compile_s = time.perf_counter() - start

        def reference(*a: Any) -> Any:
            return model_or_fn(*a, **kw)

        def run_compiled(*a: Any) -> Any:
            return compiled(*a, **kw)

        report = plait.conformance.check(
            reference, run_compiled, call_args, reference_module=module,
            candidate_module=module, draws=draws, stress=STRESS, seed=seed,
        )  # fmt: skip
        gate_s = time.perf_counter() - start - compile_s
        if report.ok:
            return Bisection(
                True, report=str(report), seconds={"compile": compile_s, "gate": gate_s}
            )
        subject = _user_subject(compiled, reference, module, call_args, kw, seed, draws)
        result = diagnose_subject(subject, repro_dir=repro_dir,
                                  shrink_seconds=shrink_seconds, stage_report=report)  # fmt: skip
    result.seconds = {"compile": compile_s, "gate": gate_s, **result.seconds,
                      "total": time.perf_counter() - start}  # fmt: skip
    return result


def _user_subject(
    compiled: Any, reference: Callable[..., Any], module: nn.Module | None,
    args: tuple[Any, ...], kwargs: dict[str, Any], seed: int, draws: int,
) -> Subject:  # fmt: skip
    engine = compiled._plait
    spec = engine.specializations[-1]
    prog = spec.program
    graph = prog.graph
    assert graph is not None
    pipeline = [p["name"] for p in spec.manifest.passes]
    state = list(engine.fetch())
    slots = {v.name: s.ref for v, s in zip(graph.inputs, prog.inputs) if s.source == "state"}
    frozen = spec.manifest.graph.get("frozen", [])
    params = {n: state[slots[n]] for n in frozen}
    program = spec.compiled.program
    stax = program.options if isinstance(getattr(program, "options", None), StaxOptions) else None

    def env_of(a: Sequence[Any]) -> tuple[GuardEnv, list[Any]]:
        tree, leaves, _ = engine.adapter.flatten(tuple(a), kwargs)
        st = list(engine.fetch())
        return GuardEnv(tree, leaves, engine.fn, st), st

    def judge(execute: Executor) -> Report:
        def candidate(*a: Any) -> Any:
            env, st = env_of(a)
            return prog.run(execute, env, st)

        # NOTE: a stage is judged on the cases the compiled program failed on: the example, the
        # same draws and the stress draw (judged on fewer, a pass wrong only on large inputs
        # passed, and the backend was blamed for it)
        return plait.conformance.check(
            reference, candidate, args, reference_module=module, candidate_module=module,
            draws=draws, stress=STRESS, seed=seed,
        )  # fmt: skip

    def sample(k: int) -> dict[str, Any]:
        # NOTE: the example, the draws as the gate makes them (its seed * 7919 + i), its stress
        # draw (a draw at its seed * 7919, scaled) and last its special-values draw (NaN and inf)
        base = seed * 7919
        if k == 0:
            drawn = args
        elif k <= draws:
            drawn = plait.conformance.draw_like(args, base + k)
        elif k == draws + 1:
            drawn = stressed(plait.conformance.draw_like(args, base), STRESS)
        else:
            special = base + SPECIAL_SEED
            drawn, _ = with_special_values(plait.conformance.draw_like(args, special), special)
        env, st = env_of(drawn)
        values = prog.graph_inputs(env, st)
        return {v.name: x for v, x in zip(graph.inputs, values)}

    return Subject(graph, pipeline, params, stax, judge, sample, samples=draws + 3)

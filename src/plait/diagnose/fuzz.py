"""The graph fuzzer: random well-typed graphs through every pass and the Stax C++ backend,
judged against the reference interpreter under the numerical contract.

Each graph (:func:`plait.diagnose.fuzz_graphs.generate`) runs the inference pipeline (its
parameters frozen and folded), is compiled by Stax, and the gate judges the program against the
interpreter running the unoptimized graph (anchored on the interpreter in float64), on fresh
draws of its inputs in their generated layouts. A graph that fails is bisected like a user's
model (:func:`plait.diagnose.bisection.diagnose_subject`) and saved as a repro.

Example:
    >>> report = fuzz(3, seed=1)
    >>> report.graphs, report.ok
    (3, True)
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from plait.conformance.report import Report
from plait.diagnose.backend import program_inputs
from plait.diagnose.bisection import Bisection, Subject, diagnose_subject
from plait.diagnose.fuzz_graphs import FuzzCase, generate
from plait.diagnose.judging import Executor, float64_executor, gate_graph, graph_executor
from plait.diagnose.replay import PassFailure, replay
from plait.ir import Category, Graph, Value, get_op, to_text
from plait.passes import INFERENCE_PIPELINE, parse_pipeline
from plait.runtime import StaxOptions, compile_graph


@dataclass
class FuzzFinding:
    """One graph the compiler got wrong: its index and generator seed, the diagnosis and what
    the graph was (its ops and IR text)."""

    index: int
    seed: int
    diagnosis: Bisection
    ops: list[str]
    graph: str

    def __str__(self) -> str:
        head = f"graph {self.index} (generator seed {self.seed}; ops {', '.join(self.ops)})"
        return f"{head}\n{self.diagnosis}"


@dataclass
class FuzzReport:
    """What a fuzz run found: ``graphs`` run, ``findings`` (each bisected, with a repro),
    ``ops`` (how often each op was drawn) and ``seconds``."""

    seed: int
    graphs: int = 0
    findings: list[FuzzFinding] = field(default_factory=list)
    ops: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary: counts, and per finding the stage, pass, node and repro."""
        return {
            "seed": self.seed,
            "graphs": self.graphs,
            "seconds": round(self.seconds, 3),
            "ops": len(self.ops),
            "divergences": [
                {
                    "index": f.index,
                    "generator_seed": f.seed,
                    "stage": f.diagnosis.stage,
                    "pass": f.diagnosis.pass_name,
                    "node": None if f.diagnosis.node is None else f.diagnosis.node.text,
                    "rule": f.diagnosis.rule,
                    "error": None if f.diagnosis.error is None else str(f.diagnosis.error),
                    "repro": None if f.diagnosis.repro is None else str(f.diagnosis.repro),
                }
                for f in self.findings
            ],
        }

    def __str__(self) -> str:
        lines = [
            f"plait fuzz: {self.graphs} graphs (seed {self.seed}), {len(self.findings)} "
            f"divergence(s), {len(self.ops)} ops drawn, {self.seconds:.1f} s"
        ]
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)


def graph_seed(seed: int, index: int) -> int:
    """The generator seed of graph ``index`` of a run with ``seed``."""
    return seed * 1_000_003 + index


def fuzz(
    n: int,
    seed: int = 0,
    *,
    repro_dir: str | Path | None = None,
    pipeline: str = INFERENCE_PIPELINE,
    stax: StaxOptions | None = None,
    seconds: float | None = None,
    shrink_seconds: float = 20.0,
    stop_after: int | None = None,
    progress: Callable[[int, FuzzReport], None] | None = None,
    start: int = 0,
    chunk: int | None = None,
) -> FuzzReport:
    """Fuzz graphs ``start`` to ``start + n - 1`` (generator seeds ``graph_seed(seed, i)``);
    stop early after ``seconds``, or once ``stop_after`` graphs diverged. Repros go to
    ``repro_dir/graph-<i>`` (else temporary directories).

    ``chunk``: run every ``chunk`` graphs in a fresh process, one after another (a process that
    compiles thousands of programs keeps each one's kernel library mapped: at about 7500 graphs
    Linux's map count limit refuses the next); ``progress`` then sees each chunk's last graph."""
    if chunk is not None:
        return _in_chunks(n, seed, start, chunk, repro_dir, pipeline, stax, seconds,
                          shrink_seconds, stop_after, progress)  # fmt: skip
    report = FuzzReport(seed)
    names = parse_pipeline(pipeline)
    options = stax or StaxOptions()
    began = time.perf_counter()
    for i in range(start, start + n):
        if seconds is not None and time.perf_counter() - began > seconds:
            break
        case = generate(graph_seed(seed, i))
        report.ops.update(case.ops)
        where = None if repro_dir is None else Path(repro_dir) / f"graph-{i}"
        diagnosis = check_case(case, names, options, where, shrink_seconds)
        report.graphs += 1
        if diagnosis is not None:
            report.findings.append(
                FuzzFinding(i, case.seed, diagnosis, case.ops, to_text(case.graph))
            )
        if progress is not None:
            progress(i, report)
        if stop_after is not None and len(report.findings) >= stop_after:
            break
    report.seconds = time.perf_counter() - began
    return report


def _in_chunks(
    n: int, seed: int, start: int, chunk: int, repro_dir: str | Path | None, pipeline: str,
    stax: StaxOptions | None, seconds: float | None, shrink_seconds: float,
    stop_after: int | None, progress: Callable[[int, FuzzReport], None] | None,
) -> FuzzReport:  # fmt: skip
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    report = FuzzReport(seed)
    began = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    for first in range(start, start + n, chunk):
        left = None if seconds is None else seconds - (time.perf_counter() - began)
        if left is not None and left <= 0:
            break
        wanted = None if stop_after is None else stop_after - len(report.findings)
        size = min(chunk, start + n - first)
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            part = pool.submit(
                fuzz, size, seed, repro_dir=repro_dir, pipeline=pipeline, stax=stax,
                seconds=left, shrink_seconds=shrink_seconds, stop_after=wanted, start=first,
            ).result()  # fmt: skip
        report.graphs += part.graphs
        report.findings += part.findings
        report.ops.update(part.ops)
        if progress is not None:
            progress(first + part.graphs - 1, report)
        if stop_after is not None and len(report.findings) >= stop_after:
            break
    report.seconds = time.perf_counter() - began
    return report


def check_case(
    case: FuzzCase,
    pipeline: list[str],
    options: StaxOptions,
    repro_dir: Path | None = None,
    shrink_seconds: float = 20.0,
) -> Bisection | None:
    """Run one generated graph through the passes and Stax and judge it; None when it
    conforms, else its diagnosis."""
    g0 = case.graph
    subject = _subject(case, pipeline, options)
    with warnings.catch_warnings():
        # NOTE: the reference's own warnings on these values (overflow in a cast) are not
        # findings; plait's warnings still are, they are errors here
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
        try:
            steps = replay(g0, pipeline, case.params)
        except PassFailure:
            return diagnose_subject(subject, repro_dir=repro_dir, shrink_seconds=shrink_seconds)
        final = steps[-1].after if steps else g0
        try:
            program = compile_graph(final, options=options)
        except Exception as exc:
            return _compile_failure(subject, exc, repro_dir, shrink_seconds)

        def run(values: list[Any]) -> list[Any]:
            named = {v.name: x for v, x in zip(g0.inputs, values)}
            return list(program(*program_inputs(final, {**final.constants, **named})))

        report = subject.judge(run)
        if report.ok:
            return None
        return diagnose_subject(
            subject, repro_dir=repro_dir, stage_report=report, shrink_seconds=shrink_seconds
        )


def _subject(case: FuzzCase, pipeline: list[str], options: StaxOptions) -> Subject:
    g0 = case.graph
    reference = graph_executor(g0.inputs, g0)
    reference64 = float64_executor(g0.inputs, g0)

    def on_user(execute: Executor) -> Executor:
        return lambda values: execute(case.inputs(values))

    roots = _view_roots(g0)

    def owned(execute: Executor) -> Executor:
        """NOTE: as plait.compile's calling convention does (CapturedProgram.run), an output
        that is a caller's input (a pass simplified ``contiguous(x)`` to ``x``), or that is
        another output's memory where the original graph made two tensors (cse merged them),
        is handed out as a copy."""

        def run(values: list[Any]) -> list[Any]:
            inputs = {x.untyped_storage().data_ptr() for x in values if isinstance(x, Tensor)}
            handed: dict[int, str] = {}
            out = []
            for t, root in zip(execute(values), roots):
                if isinstance(t, Tensor):
                    ptr = t.untyped_storage().data_ptr()
                    if ptr in inputs or handed.get(ptr, root) != root:
                        t = t.clone()
                        ptr = t.untyped_storage().data_ptr()
                    handed.setdefault(ptr, root)
                out.append(t)
            return out

        return run

    def judge(execute: Executor) -> Report:
        candidate = owned(on_user(execute))
        return gate_graph(on_user(reference), on_user(reference64), candidate, case.draw)

    def sample(k: int) -> dict[str, Any]:
        # NOTE: the gate's draws: factory(seed * 7919 + i) for i = 1, 2, ...; the gate's seed 0
        return {v.name: x for v, x in zip(g0.inputs, case.inputs(case.draw(k + 1)))}

    return Subject(g0, pipeline, dict(case.params), options, judge, sample)


def _view_roots(graph: Graph) -> list[str]:
    """Each output's root through view ops: outputs of one root may share memory in the
    original graph's run; outputs of two never do."""
    roots = []
    for i, v in enumerate(graph.outputs):
        while isinstance(v, Value) and v.producer is not None:
            if get_op(v.producer.op).category is not Category.VIEW:
                break
            v = v.producer.inputs[0]
        roots.append(v.name if isinstance(v, Value) else f"#{i}")
    return roots


def _compile_failure(
    subject: Subject, exc: Exception, repro_dir: Path | None, shrink_seconds: float
) -> Bisection:
    """Stax raised while compiling: the backend is the stage; the repro shrinks the optimized
    graph while the compile still raises so."""
    out = diagnose_subject(subject, repro_dir=repro_dir, shrink_seconds=shrink_seconds)
    if out.stage != "backend" or out.node is None:
        out.notes.append(
            f"Stax raised {type(exc).__name__} compiling it: "
            + "".join(traceback.format_exception_only(exc)).strip()
        )
    return out

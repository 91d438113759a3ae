"""What a compile report shows, gathered from a compiled callable or from a saved manifest.

A :class:`CallableView` holds one compiled callable: its specializations (the root's, then each
region's), each a :class:`SpecializationView` with the manifest, the graph text after capture
and after each pass (with the diff each pass made), and the programs it runs
(:class:`ProgramView`: the inference program, or a training program's forward and backward),
each with its final graph, per-node evidence and kernels with their sources. Nothing here
renders; :mod:`plait.compile_report.page` does.

Example:
    >>> from plait.manifest import Manifest
    >>> view = from_manifest(Manifest(source_hash="ab" * 32), "model.json")
    >>> [s.title for s in view.specializations], view.specializations[0].passes
    (['specialization 0'], [])
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from plait.ir import Graph, Value
from plait.ir.text import format_operand, format_type, node_text
from plait.manifest import Explanation, Manifest

# NOTE: a diff shows this many unchanged lines around each change
DIFF_CONTEXT = 2


@dataclass
class PassStep:
    """One pass as it ran: its manifest record, seconds, and the graph it returned (``text``:
    None when this process did not run it, e.g. an artifact loaded from the cache) with the
    lines it changed against the graph before it (``diff``, unified)."""

    index: int
    name: str
    changed: bool
    rewrites: list[dict[str, Any]]
    details: dict[str, Any]
    seconds: float | None
    text: str | None = None
    diff: list[str] = field(default_factory=list)

    def rule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rewrites:
            counts[r["rule"]] = counts.get(r["rule"], 0) + 1
        return dict(sorted(counts.items()))


@dataclass
class KernelView:
    """A generated kernel: its manifest record and its source (empty when it was not kept)."""

    name: str
    record: dict[str, Any]
    source: str = ""


@dataclass
class ProgramView:
    """One program the specialization runs: ``graph`` (None when only the manifest is known),
    ``executor`` (the manifest's executor record: evidence, memory plan, options), its kernels
    in schedule order and the schedule."""

    title: str
    graph: Graph | None
    executor: dict[str, Any]
    kernels: list[KernelView]
    schedule: list[dict[str, Any]]
    # NOTE: a training half: the passes it ran after the partition
    passes: list[PassStep] = field(default_factory=list)

    def evidence(self) -> dict[int, tuple[str, str]]:
        """Node id -> (executor, detail)."""
        nodes = self.executor.get("evidence", {}).get("nodes", [])
        return {int(n["id"]): (str(n["executor"]), str(n["detail"])) for n in nodes}

    def kernel_of(self) -> dict[int, str]:
        """Node id -> the name of the kernel that computes it."""
        return {int(n): k.name for k in self.kernels for n in k.record.get("nodes", [])}


@dataclass
class SpecializationView:
    """One specialization: why it was compiled, its guards, its manifest, its graphs."""

    title: str
    anchor: str
    index: int
    reason: str | None
    guards: list[str]
    guard_evaluator: str
    manifest: Manifest
    key: str = ""
    calls: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    captured: str | None = None
    passes: list[PassStep] = field(default_factory=list)
    programs: list[ProgramView] = field(default_factory=list)
    shared_with: str | None = None  # an identical block's specialization it shares, if any


@dataclass
class CallableView:
    """A compiled callable: ``name``, its specializations, and what ``plait.explain`` says
    about its regions and its eager fallback past the recompile limit."""

    name: str
    specializations: list[SpecializationView]
    explanation: Explanation | None = None
    source: str = "a compiled callable in this process"


def graph_listing(graph: Graph) -> str:
    """``graph`` as text, one node a line, each line led by its node id (``#12``): the ids
    that the manifest's rewrites, evidence and kernels name.

    Example:
        >>> import torch
        >>> from plait.ir import GraphBuilder, TensorType
        >>> b = GraphBuilder()
        >>> b.output(b.call("relu", b.input("x", TensorType((2,), torch.float32))))
        >>> print(graph_listing(b.build()))
        inputs:
              user %x: f32[2]
        #0    %0 = relu(%x) : f32[2]
        return %0
    """
    lines = ["inputs:"]
    lines += [f"      {v.kind} %{v.name}: {format_type(v.type)}" for v in graph.inputs]
    for n in graph.nodes:
        lines.append(f"#{n.id:<4} {node_text(n, _name)}")
    lines.append("return " + ", ".join(format_operand(o) for o in graph.outputs))
    return "\n".join(lines)


def _name(v: Value) -> str:
    return v.name


def _diff(before: str | None, after: str) -> list[str]:
    if before is None:
        return []
    lines = difflib.unified_diff(
        before.splitlines(), after.splitlines(), "before", "after", n=DIFF_CONTEXT, lineterm=""
    )
    return list(lines)[2:]  # NOTE: without the ---/+++ header lines


def pass_steps(
    records: list[dict[str, Any]],
    before: str | None,
    graphs: list[Graph],
    timings: dict[str, Any] | None = None,
) -> list[PassStep]:
    """Pass records (a manifest's ``passes``), each with the graph it returned where ``graphs``
    has it (one per pass, in order, as :class:`plait.backends.Compiled` keeps them) and its
    diff against the graph before it (``before``: the first pass's input, as listed)."""
    steps = []
    kept = len(graphs) == len(records)
    for i, record in enumerate(records):
        seconds = (timings or {}).get(f"pass.{i}:{record.get('name')}")
        step = PassStep(
            i,
            str(record.get("name", "?")),
            bool(record.get("changed")),
            list(record.get("rewrites", [])),
            dict(record.get("details", {})),
            float(seconds) if isinstance(seconds, (int, float)) else None,
        )
        if kept:
            step.text = graph_listing(graphs[i])
            step.diff = _diff(before, step.text)
            before = step.text
        steps.append(step)
    return steps


def _kernels(records: list[dict[str, Any]], infos: list[Any]) -> list[KernelView]:
    sources = {getattr(k, "name", None): getattr(k, "source", "") or "" for k in infos}
    return [KernelView(str(r["name"]), r, sources.get(r["name"], "")) for r in records]


def programs(compiled: Any, manifest: Manifest) -> list[ProgramView]:
    """The programs of a specialization (``compiled``: its :class:`plait.backends.Compiled`,
    or None when only the manifest is known)."""
    program = getattr(compiled, "program", None)
    executor = dict(manifest.executor)
    backward = executor.pop("backward", None)
    kernels = manifest.kernels
    if backward is None:
        infos = list(getattr(program, "kernels", []) or [])
        graph = getattr(program, "graph", None) or getattr(compiled, "graph", None)
        main = ProgramView(
            "program",
            graph,
            executor,
            _kernels(kernels.get("kernels", []), infos),
            list(kernels.get("schedule", [])),
        )
        return [main]
    forward = getattr(program, "forward", None)
    back = getattr(program, "backward", None)
    halves = [
        ProgramView(
            "forward",
            getattr(program, "forward_graph", None),
            executor,
            _kernels(kernels.get("kernels", []), list(getattr(forward, "kernels", []))),
            list(kernels.get("schedule", [])),
        ),
        ProgramView(
            "backward",
            getattr(program, "backward_graph", None),
            backward,
            _kernels(kernels.get("backward_kernels", []), list(getattr(back, "kernels", []))),
            list(kernels.get("backward_schedule", [])),
        ),
    ]
    _half_passes(halves, program, manifest)
    return halves


def _half_passes(halves: list[ProgramView], program: Any, manifest: Manifest) -> None:
    """Each training half's passes after the partition, with their graphs where this process
    ran them."""
    recorded = manifest.autograd.get("passes", {})
    results = getattr(program, "passes", None)
    part = getattr(program, "partition", None)
    for i, half in enumerate(halves):
        records = list(recorded.get(half.title, []))
        graphs: list[Graph] = []
        before = None
        if results is not None and part is not None:
            graphs = [r.graph for r in results[i].records if r.graph is not None]
            before = graph_listing(part.forward if i == 0 else part.backward)
        half.passes = pass_steps(records, before, graphs)


def _specialization(
    title: str, anchor: str, index: int, s: Any, shared_with: str | None
) -> SpecializationView:
    manifest: Manifest = s.manifest
    compiled = s.compiled
    graph = s.program.graph if s.program.has_graph else None
    captured = graph_listing(graph) if graph is not None else None
    view = SpecializationView(
        title,
        anchor,
        index,
        s.reason,
        s.guards.texts(),
        s.guards.evaluator,
        manifest,
        key=s.key,
        calls=s.calls,
        settings={k: str(v) for k, v in s.settings.items()},
        captured=captured,
        shared_with=shared_with,
    )
    if shared_with is not None:
        return view
    kept = list(compiled.pass_graphs)
    view.passes = pass_steps(manifest.passes, captured, kept, manifest.timings)
    if s.executor is not None and graph is not None:
        view.programs = programs(compiled, manifest)
    return view


def _engines(engine: Any) -> list[tuple[str, Any]]:
    """The root engine, then each region engine that compiled something, with their titles."""
    out = [("", engine)]
    tree = getattr(engine, "tree", None)
    if tree is not None:
        out += [(f"region {e.path or '<root>'}", e) for e in tree.order if e.specializations]
    return out


def from_compiled(compiled: Any) -> CallableView:
    """The view of what ``plait.compile`` returned (after at least one call, or it shows no
    specialization)."""
    from plait.api import explain

    explanation = explain(compiled)
    engine = compiled._plait
    specs: list[SpecializationView] = []
    seen: dict[int, str] = {}  # NOTE: identical blocks share one Compiled: shown once
    for prefix, e in _engines(engine):
        for i, s in enumerate(e.specializations):
            title = f"{prefix} specialization {i}".strip()
            anchor = f"s{len(specs)}"
            first = seen.setdefault(id(s.compiled), title)
            shared = None if first == title else first
            specs.append(_specialization(title, anchor, i, s, shared))
    return CallableView(explanation.name, specs, explanation)


def from_explanation(explanation: Explanation, source: str) -> CallableView:
    """The view of what ``plait.explain`` says of a callable whose graphs this process does not
    hold (a loaded export artifact): each specialization's guards, reason and manifest."""
    views = []
    for s in explanation.specializations:
        view = SpecializationView(
            f"specialization {s.index}",
            f"s{s.index}",
            s.index,
            s.reason,
            list(s.guards),
            s.guard_evaluator,
            s.manifest,
        )
        view.passes = pass_steps(s.manifest.passes, None, [], s.manifest.timings)
        if s.manifest.executor:
            view.programs = programs(None, s.manifest)
        views.append(view)
    return CallableView(explanation.name, views, explanation, source)


def from_manifest(manifest: Manifest, source: str) -> CallableView:
    """The view of one saved manifest (``source`` names its file): passes, kernels, evidence
    and plans as recorded; no graph text, picture or kernel source (a manifest keeps none)."""
    view = SpecializationView(
        "specialization 0",
        "s0",
        0,
        None,
        list(manifest.guards),
        "unknown (a saved manifest)",
        manifest,
    )
    view.passes = pass_steps(manifest.passes, None, [], manifest.timings)
    if manifest.executor:
        view.programs = programs(None, manifest)
    return CallableView(f"manifest {source}", [view], None, f"the saved manifest {source}")

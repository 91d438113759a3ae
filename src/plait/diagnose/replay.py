"""Replaying a pass pipeline one pass at a time, and finding, inside one pass's output, the
first value that diverges from the pass's input graph.

Inside a pass, values correspond in two ways: by name (a node the pass left alone keeps its
values' names) and by use (where a node the pass left alone, same id and op, reads operand ``i``,
the pass's output feeds it what replaced the input graph's operand ``i``). The output graph is
run with the reference interpreter *resynchronized*: every operand of a corresponding node is
judged against its reference and then replaced by it, so each comparison measures only what the
nodes since the last correspondence did (errors never accumulate from one site to the next).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((8,), torch.float32))
    >>> gb.output(gb.call("relu", gb.call("mul", x, 1)))
    >>> steps = replay(gb.build(), ["simplify", "dce"], {})
    >>> [(s.name, s.record.changed) for s in steps]
    [('simplify', True), ('dce', False)]
    >>> localize_pass(steps[0], {"x": torch.randn(8)}) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plait.diagnose.judging import Measure, judge_value, op_class_of, share_of_budget
from plait.diagnose.values import evaluate, producers
from plait.ir import Graph, Node, Value
from plait.ir.text import node_text
from plait.passes import PassRecord, get_pass, run_pipeline


@dataclass
class PassStep:
    """One pass of a replayed pipeline: its position, name, input and output graphs, record."""

    index: int
    name: str
    before: Graph
    after: Graph
    record: PassRecord

    @property
    def semantics(self) -> str:
        return get_pass(self.name).semantics


class PassFailure(Exception):
    """Pass ``name`` (the ``index``-th of the pipeline) raised on ``graph``: ``error`` is what
    it raised (a :class:`~plait.errors.SemanticDriftError` when the verifier rejected its
    output)."""

    def __init__(self, index: int, name: str, graph: Graph, error: Exception) -> None:
        super().__init__(f"pass {name!r} raised {type(error).__name__}: {error}")
        self.index, self.name, self.graph, self.error = index, name, graph, error


def replay(
    graph: Graph, pipeline: Sequence[str], params: Mapping[str, Any], checks: bool = True
) -> list[PassStep]:
    """Run ``pipeline`` on ``graph`` one pass at a time, keeping every intermediate graph. With
    ``checks`` the verifier runs after each pass. A pass that raises (or whose output the
    verifier rejects) raises :class:`PassFailure` naming it."""
    steps = []
    for i, name in enumerate(pipeline):
        try:
            result = run_pipeline(graph, [name], params=params, checks=checks)
        except Exception as exc:
            raise PassFailure(i, name, graph, exc) from exc
        steps.append(PassStep(i, name, graph, result.graph, result.records[0]))
        graph = result.graph
    return steps


@dataclass
class Divergence:
    """Where a value first diverged: ``node`` (the node blamed, in the graph named by
    ``graph``: ``"after"`` the pass, ``"before"`` it, or ``"program"`` for the backend),
    ``value`` (the reference value's name), the gate's ``measure`` and ``exceeded`` (False when
    no value broke its budget and this is the one that came closest)."""

    node: Node | None
    graph: str
    value: str
    measure: Measure
    exceeded: bool = True
    share: float = 0.0
    replaced: Node | None = None  # the input graph's node a rewrite replaced (pass stage)
    rule: str | None = None
    kernel: str | None = None  # the backend's fused kernel, when the node ran in one
    note: str = ""

    def node_line(self) -> str:
        if self.node is None:
            return ""
        return node_text(self.node, lambda v: v.name)


def raised(error: BaseException, node: Node | None = None, graph: str = "program") -> Divergence:
    """A divergence that is an exception (the stage raised instead of computing)."""
    measure = Measure("exception", type(error).__name__, "diagnosis", str(error)[:2000])
    return Divergence(node, graph, "", measure)


def same_failure(a: Divergence, b: Divergence | None) -> bool:
    """Is ``b`` the same kind of failure as ``a`` (both beyond budget; both values out of
    their rows, both outputs in kept storage, or both exceptions of one type)?"""
    if b is None or not b.exceeded or not a.exceeded:
        return False
    special = ("exception", "alias")
    if a.measure.check in special or b.measure.check in special:
        same_check = a.measure.check == b.measure.check
        return same_check and (a.measure.check == "alias" or a.measure.where == b.measure.where)
    return True


class _Found(Exception):
    def __init__(self, divergence: Divergence) -> None:
        self.divergence = divergence


class _Closest:
    def __init__(self) -> None:
        self.best: Divergence | None = None

    def offer(self, d: Divergence) -> None:
        if self.best is None or d.share > self.best.share:
            self.best = d


def localize_pass(step: PassStep, inputs: Mapping[str, Any]) -> Divergence | None:
    """The first value of ``step.after`` that diverges from its counterpart in ``step.before``
    on ``inputs`` (values of ``step.before``'s inputs by name), resynchronized; when none breaks
    its budget, the one closest to it (``exceeded=False``); None when every value is equal."""
    before, after = step.before, step.after
    ref = evaluate(before, inputs)
    by_id = {n.id: n for n in before.nodes}
    made_in_before = producers(before)
    types_before = {v.name: str(v.type) for v in before.inputs}
    types_before.update({v.name: str(v.type) for n in before.nodes for v in n.outputs})
    made_in_after = producers(after)
    closest = _Closest()

    def counterpart(n: Node) -> Node | None:
        cp = by_id.get(n.id)
        if cp is None or cp.op != n.op or len(cp.inputs) != len(n.inputs):
            return None
        return cp

    def new_chain(name: str) -> list[Node]:
        """The nodes of ``after`` with no counterpart that compute ``name`` from values
        that have one."""
        out, todo, seen = [], [name], set()
        while todo:
            p = made_in_after.get(todo.pop())
            if p is None or id(p) in seen or counterpart(p) is not None:
                continue
            seen.add(id(p))
            out.append(p)
            todo.extend(v.name for v in p.input_values())
        return out

    def judge(actual: Any, b: str, a: str, culprit: Node | None, replaced: Node | None) -> None:
        ref_node = made_in_before.get(b)
        chain = new_chain(a)
        classes = [op_class_of(ref_node), *(op_class_of(m) for m in chain)]
        if culprit is not None:
            classes.append(op_class_of(culprit))
        where = f"%{b}" if a == b else f"%{b} (now %{a})"
        measure = judge_value(ref[b], actual, classes, where)
        share = share_of_budget(ref[b], actual, classes)
        blamed = chain[0] if chain else culprit
        graph = "after"
        if blamed is None or (a != b and not chain):
            blamed, graph = replaced, "before"
        rule = _rule(step.record, blamed, replaced)
        exceeded = measure is not None
        shown = measure or closest_measure(where, share)
        d = Divergence(blamed, graph, b, shown, exceeded, share, replaced, rule)
        if measure is not None:
            raise _Found(d)
        if share > 0:
            closest.offer(d)

    def args_of(n: Node, values: dict[str, Any]) -> list[Any]:
        cp = counterpart(n)
        args = []
        for i, o in enumerate(n.inputs):
            if not isinstance(o, Value):
                args.append(o)
                continue
            b = cp.inputs[i] if cp is not None else None
            if isinstance(b, Value) and types_before.get(b.name) == str(o.type):
                if b.name != o.name:
                    judge(values[o.name], b.name, o.name, None, made_in_before.get(b.name))
                args.append(ref[b.name])  # NOTE: resynchronized
            else:
                args.append(values[o.name])
        return args

    def after_node(n: Node, args: list[Any], results: list[Any]) -> list[Any]:
        kept = []
        for v, r in zip(n.outputs, results):
            if v.name in ref and types_before.get(v.name) == str(v.type):
                judge(r, v.name, v.name, n, by_id.get(n.id))
                kept.append(ref[v.name])
            else:
                kept.append(r)
        return kept

    given = {v.name: inputs[v.name] for v in after.inputs if v.name in inputs}
    try:
        values = evaluate(after, given, after=after_node, args_of=args_of)
        for o_after, o_before in zip(after.outputs, before.outputs):
            if not (isinstance(o_after, Value) and isinstance(o_before, Value)):
                continue
            if o_after.name != o_before.name:
                replaced = made_in_before.get(o_before.name)
                judge(values[o_after.name], o_before.name, o_after.name, None, replaced)
    except _Found as found:
        return found.divergence
    return closest.best


def closest_measure(where: str, share: float) -> Measure:
    return Measure(
        "closest", where, "diagnosis",
        f"no value broke its budget; this one used {share:.3g} of it",
    )  # fmt: skip


def _rule(record: PassRecord, node: Node | None, replaced: Node | None) -> str | None:
    """The rewrite rule of ``record`` that produced ``node`` or replaced ``replaced``."""
    for rw in record.rewrites:
        if node is not None and node.id in rw.produced:
            return rw.rule
    for rw in record.rewrites:
        if replaced is not None and replaced.id in rw.replaced:
            return rw.rule
        if node is not None and node.id in rw.replaced:
            return rw.rule
    return None

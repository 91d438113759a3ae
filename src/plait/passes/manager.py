"""The PassManager: named passes, pipelines as straight-line code or text, one record per pass.

A pass is a function ``(graph, ctx) -> graph`` registered under a name; it reports what it did
through ``ctx.record`` (a :class:`PassRecord`). The manager copies the graph before each pass, so
a pass may mutate what it is given, and each record keeps the graph its pass returned
(``record.graph``: the next pass works on a copy, so keeping it costs no copy; the compile report
shows it). With ``checks=True`` (always in tests) the verifier runs after
every pass, and a broken invariant raises :class:`plait.errors.SemanticDriftError` naming the pass
and the node.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.passes import run_pipeline
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((3,), torch.float32))
    >>> dead = b.call("exp", x)
    >>> b.output(b.call("mul", x, 1))
    >>> result = run_pipeline(b.build(), "simplify,dce")
    >>> [r.name for r in result.records], len(result.graph.nodes)
    (['simplify', 'dce'], 0)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait import logs
from plait.errors import InvalidOptionError, SemanticDriftError, UnknownKeyError
from plait.ir import Graph, VerificationError, to_text, verify

# How a pass relates the meaning of its output to its input (what the tests hold it to):
EXACT = "exact"  # bitwise-equal results: the order of arithmetic is kept
VALUE_EQUAL = "value-equal"  # equal as IEEE values (may change the sign of a zero)
CONTRACT = "contract"  # different arithmetic; judged by the numerical contract


@dataclass
class RewriteRecord:
    """One rewrite that fired: the rule, the node ids it replaced and the ids it produced."""

    rule: str
    replaced: list[int]
    produced: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "replaced": self.replaced, "produced": self.produced}


@dataclass
class PassRecord:
    name: str
    changed: bool = False
    rewrites: list[RewriteRecord] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    # NOTE: the graph the pass returned; outside to_json (the manifest has no graphs)
    graph: Graph | None = field(default=None, repr=False, compare=False)

    def fired(self, rule: str, replaced: Sequence[int], produced: Sequence[int]) -> None:
        self.changed = True
        self.rewrites.append(RewriteRecord(rule, list(replaced), list(produced)))

    def to_json(self) -> dict[str, Any]:
        """The manifest's view (timings live in the manifest's own ``timings`` section)."""
        return {
            "name": self.name,
            "changed": self.changed,
            "rewrites": [r.to_json() for r in self.rewrites],
            "details": self.details,
        }


@dataclass
class PassContext:
    """What a pass may read besides the graph, and where it records what it did.

    ``params`` maps parameter/buffer names to tensors (for freezing); ``options`` holds per-pass
    options, e.g. ``{"decompose": {"ops": ["softmax"]}}``.
    """

    record: PassRecord
    params: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(self.record.name, {}).get(key, default)


PassFn = Callable[[Graph, PassContext], Graph]


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: PassFn
    semantics: str
    doc: str
    rules: tuple[str, ...] = ()


_PASSES: dict[str, PassInfo] = {}


def register_pass(
    name: str, semantics: str, rules: Sequence[str] = ()
) -> Callable[[PassFn], PassFn]:
    """Decorator: register ``fn`` as the pass ``name``; ``rules`` lists its rewrite rules."""

    def wrap(fn: PassFn) -> PassFn:
        if name in _PASSES:
            raise InvalidOptionError(f"pass {name!r} is already registered")
        _PASSES[name] = PassInfo(name, fn, semantics, (fn.__doc__ or "").strip(), tuple(rules))
        return fn

    return wrap


def all_passes() -> dict[str, PassInfo]:
    return dict(_PASSES)


def get_pass(name: str) -> PassInfo:
    try:
        return _PASSES[name]
    except KeyError:
        raise UnknownKeyError(
            f"unknown pass {name!r}; known passes: {', '.join(sorted(_PASSES))}"
        ) from None


def parse_pipeline(text: str | Sequence[str]) -> list[str]:
    """``"cse,dce,fold-bn"`` → ``["cse", "dce", "fold-bn"]``, each checked to exist."""
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    for n in names:
        get_pass(n)
    return names


@dataclass
class PipelineResult:
    graph: Graph
    records: list[PassRecord]
    source_hash: str | None

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json() for r in self.records]

    def timings(self) -> dict[str, float]:
        return {f"{i}:{r.name}": r.seconds for i, r in enumerate(self.records)}


def run_pipeline(
    graph: Graph,
    pipeline: str | Sequence[str],
    *,
    params: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    checks: bool = True,
    source_hash: str | None = None,
) -> PipelineResult:
    """Run the named passes in order. ``source_hash`` (minted at capture) is carried untouched."""
    records: list[PassRecord] = []
    texts = _Texts()
    for name in parse_pipeline(pipeline):
        info = get_pass(name)
        record = PassRecord(name)
        ctx = PassContext(record, params or {}, options or {})
        start = time.perf_counter()
        before, graph = graph, info.fn(graph.copy(), ctx)
        record.seconds = time.perf_counter() - start
        record.graph = graph
        if not record.changed and texts.differ(before, graph):
            # NOTE: the record says what the pass did; a pass that rewrote without saying so
            # (a user's pass that forgot ``ctx.record.fired``) would be "unchanged" in the
            # manifest and skipped by plait.diagnose's bisection, which blamed the next stage
            record.changed = True
            record.details[UNRECORDED] = UNRECORDED_DETAIL
        records.append(record)
        _log(record, graph)
        if checks:
            try:
                verify(graph)
            except VerificationError as exc:
                node_id = exc.node.id if exc.node is not None else None
                raise SemanticDriftError(name, str(exc), node_id) from exc
    return PipelineResult(graph, records, source_hash)


# NOTE: the detail a pass's record gets when its output differs from its input though the
# pass recorded no rewrite
UNRECORDED = "unrecorded_change"
UNRECORDED_DETAIL = "the output differs from the input, but the pass recorded no rewrite"


class _Texts:
    """Whether a pass's output differs from its input (its IR text, or a constant's value
    object), each graph's text made once: a pass's output is the next pass's input."""

    def __init__(self) -> None:
        self._last: tuple[Graph, str] | None = None

    def text(self, graph: Graph) -> str:
        if self._last is None or self._last[0] is not graph:
            self._last = (graph, to_text(graph))
        return self._last[1]

    def differ(self, before: Graph, after: Graph) -> bool:
        if before.constants.keys() != after.constants.keys() or any(
            after.constants[k] is not v for k, v in before.constants.items()
        ):
            return True
        old = self.text(before)
        return old != self.text(after)


def _log(record: PassRecord, graph: Graph) -> None:
    """The ``passes`` channel: each pass, the rules that fired; debug: the graph it changed."""
    counts: dict[str, int] = {}
    for r in record.rewrites:
        counts[r.rule] = counts.get(r.rule, 0) + 1
    rules = ", ".join(f"{k}×{v}" for k, v in sorted(counts.items()))
    what = f"changed ({rules})" if record.changed else "unchanged"
    logs.emit(
        "passes",
        "pass",
        lambda: f"{record.name}: {what}, {record.seconds * 1e3:.2f} ms",
        name=record.name,
        changed=record.changed,
        rules=counts,
        seconds=record.seconds,
    )
    if record.changed:
        logs.debug("passes", "graph", lambda: f"after {record.name}:\n{to_text(graph)}")

"""Rewrites as data: (pattern, replacement) rules, and the one driver that runs them.

A pattern is a tree of :class:`Op`, :class:`Var` and :class:`Lit`. A rule's replacement function
gets the match and an :class:`Emitter` (which inserts new nodes before the matched root) and
returns the values that replace the root's outputs, or ``None`` to decline. The driver rejects a
replacement whose types differ from the root's (a rule can never change a program's types), erases
the matched nodes that became dead, and records every firing with node ids in and out.

Example:
    >>> from plait.passes.rewrite import Lit, Op, Rule, Var
    >>> mul_one = Rule("simplify.mul-one", Op("mul", Var("x"), Lit(lambda v: v == 1)),
    ...                lambda m, emit: m["x"])
    >>> mul_one.pattern.ops
    ('mul',)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.errors import InternalCompilerError
from plait.ir import Graph, Node, Operand, Value, get_op
from plait.ir.ops.registry import ComplexDtypeError
from plait.passes.manager import PassRecord


@dataclass(frozen=True)
class Var:
    """Binds any operand (a value or a literal) that satisfies ``where``."""

    name: str
    where: Callable[[Operand], bool] | None = None


@dataclass(frozen=True)
class Lit:
    """Matches a literal scalar operand that satisfies ``where``."""

    where: Callable[[Any], bool]
    name: str | None = None


@dataclass(frozen=True, init=False)
class Op:
    """Matches a node by op name(s), operand patterns and an attribute predicate.

    A nested ``Op`` (not the root) with ``single_use=True`` only matches a node whose outputs have
    one user, so that rewriting does not duplicate its work.
    """

    ops: tuple[str, ...]
    args: tuple[Any, ...] | None
    attrs: Callable[[dict[str, Any]], bool] | None
    name: str | None
    single_use: bool

    def __init__(
        self,
        op: str | Sequence[str],
        *args: Any,
        attrs: Callable[[dict[str, Any]], bool] | None = None,
        name: str | None = None,
        single_use: bool = False,
        any_args: bool = False,
    ) -> None:
        object.__setattr__(self, "ops", (op,) if isinstance(op, str) else tuple(op))
        object.__setattr__(self, "args", None if any_args else tuple(args))
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "single_use", single_use)


@dataclass
class Match:
    bindings: dict[str, Any] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.bindings[key]

    @property
    def root(self) -> Node:
        return self.nodes[0]


Replacement = Callable[[Match, "Emitter"], Any]


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: Op
    replace: Replacement
    doc: str = ""


class Emitter:
    """Builds new nodes (types from the op's type rule) to insert before the matched root."""

    def __init__(self, graph: Graph, next_id: int) -> None:
        self.graph = graph
        self.next_id = next_id
        self.nodes: list[Node] = []
        self._names = {v.name for v in graph.inputs} | {
            v.name for n in graph.nodes for v in n.outputs
        }

    def __call__(self, op: str, *inputs: Any, **attrs: Any) -> Any:
        opdef = get_op(op)
        flat, full, types = opdef.infer(inputs, attrs)
        node = Node(self.next_id, opdef.name, flat, full)
        self.next_id += 1
        outs = []
        for i, t in enumerate(types):
            name = f"{node.id}" if len(types) == 1 else f"{node.id}.{i}"
            while name in self._names:
                name = "_" + name
            self._names.add(name)
            outs.append(Value(name, t, node, i))
        node.outputs = tuple(outs)
        self.nodes.append(node)
        return node.outputs[0] if opdef.fixed_outputs == 1 else node.outputs


def _users(graph: Graph) -> dict[int, int]:
    counts: dict[int, int] = {}
    for n in graph.nodes:
        for v in n.input_values():
            counts[id(v)] = counts.get(id(v), 0) + 1
    for o in graph.outputs:
        if isinstance(o, Value):
            counts[id(o)] = counts.get(id(o), 0) + 1
    return counts


def match(pattern: Any, operand: Any, m: Match, users: dict[int, int], root: bool) -> bool:
    if isinstance(pattern, Var):
        if pattern.where is not None and not pattern.where(operand):
            return False
        if pattern.name in m.bindings:
            return m.bindings[pattern.name] is operand
        m.bindings[pattern.name] = operand
        return True
    if isinstance(pattern, Lit):
        if isinstance(operand, Value) or not pattern.where(operand):
            return False
        if pattern.name:
            m.bindings[pattern.name] = operand
        return True
    assert isinstance(pattern, Op)
    node = operand if root else (operand.producer if isinstance(operand, Value) else None)
    if node is None or node.op not in pattern.ops:
        return False
    if not root and pattern.single_use and any(users.get(id(v), 0) != 1 for v in node.outputs):
        return False
    if pattern.attrs is not None and not pattern.attrs(node.attrs):
        return False
    m.nodes.append(node)  # NOTE: pre-order, so the root is nodes[0]
    if pattern.args is not None:
        if len(pattern.args) != len(node.inputs):
            return False
        for p, o in zip(pattern.args, node.inputs):
            if not match(p, o, m, users, False):
                return False
    if pattern.name:
        m.bindings[pattern.name] = node
    return True


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _same_type(a: Any, b: Value) -> bool:
    return isinstance(a, Value) and str(a.type) == str(b.type)


def apply_rules(
    graph: Graph, rules: Sequence[Rule], record: PassRecord, max_rounds: int = 50
) -> Graph:
    """Run ``rules`` to a fixpoint over ``graph`` (mutated in place, and returned)."""
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        for op in rule.pattern.ops:
            by_op.setdefault(op, []).append(rule)
    next_id = graph.next_node_id()
    for _ in range(max_rounds):
        fired = False
        # NOTE: the use counts and the set of present nodes are kept up to date by _try as
        # rules fire (a rule that declines changes nothing), never recounted per try.
        users = _users(graph)
        present = {id(n) for n in graph.nodes}
        for node in list(graph.nodes):
            if id(node) not in present:
                continue
            for rule in by_op.get(node.op, ()):
                if _try(graph, node, rule, record, next_id, users, present):
                    next_id = graph.next_node_id()
                    fired = True
                    break
        if not fired:
            return graph
    raise InternalCompilerError(
        f"rewrites did not reach a fixpoint in {max_rounds} rounds "
        f"(last pass {record.name!r}); a rule set cycles"
    )


def _try(
    graph: Graph,
    node: Node,
    rule: Rule,
    record: PassRecord,
    next_id: int,
    users: dict[int, int],
    present: set[int],
) -> bool:
    """Fire ``rule`` at ``node`` if it matches; ``users`` (use counts by value id) and
    ``present`` (ids of the graph's nodes) are updated to the rewritten graph."""
    m = Match()
    if not match(rule.pattern, node, m, users, True):
        return False
    emit = Emitter(graph, next_id)
    try:
        result = rule.replace(m, emit)
    except ComplexDtypeError:
        return False  # NOTE: a rewrite into ops that refuse complex tensors declines
    if result is None:
        return False
    repl = _as_tuple(result)
    if len(repl) != len(node.outputs) or not all(
        _same_type(r, v) for r, v in zip(repl, node.outputs)
    ):
        return False  # NOTE: a rule may never change a program's types; it declines instead.
    at = graph.nodes.index(node)
    graph.nodes[at:at] = emit.nodes
    for n in emit.nodes:
        present.add(id(n))
        for v in n.input_values():
            users[id(v)] = users.get(id(v), 0) + 1
    mapping = dict(zip((id(v) for v in node.outputs), repl))
    for old_id, new in mapping.items():
        if isinstance(new, Value) and id(new) != old_id:
            users[id(new)] = users.get(id(new), 0) + users.pop(old_id, 0)
    replace_uses(graph, mapping, start=at + len(emit.nodes))
    removed = erase_dead(graph, m.nodes, users, present)
    record.fired(rule.name, [n.id for n in removed] or [node.id], [n.id for n in emit.nodes])
    return True


def replace_uses(graph: Graph, mapping: dict[int, Any], start: int = 0) -> None:
    """Point every use of the mapped values (by id) at their replacements; ``start``: the
    position of the first node that may use them (the graph is in topological order)."""
    for n in graph.nodes[start:]:
        if any(isinstance(o, Value) and id(o) in mapping for o in n.inputs):
            n.inputs = tuple(mapping.get(id(o), o) if isinstance(o, Value) else o for o in n.inputs)
    graph.outputs = [mapping.get(id(o), o) if isinstance(o, Value) else o for o in graph.outputs]


def erase_dead(
    graph: Graph, candidates: Sequence[Node], users: dict[int, int], present: set[int]
) -> list[Node]:
    """Erase the candidates whose outputs have no users left (iterating, root first);
    ``users`` (use counts by value id) and ``present`` (node ids) are updated."""
    removed: list[Node] = []
    progress = True
    while progress:
        progress = False
        for n in candidates:
            if id(n) in present and all(users.get(id(v), 0) == 0 for v in n.outputs):
                present.discard(id(n))
                removed.append(n)
                for v in n.input_values():
                    users[id(v)] -= 1
                progress = True
    if removed:
        gone = {id(n) for n in removed}
        graph.nodes[:] = [n for n in graph.nodes if id(n) not in gone]
    return removed

"""The layout oracle: what the fusion planner asks about extern calls, and who answers.

The planner (:mod:`plait.codegen.fusion`) decides which nodes fuse into which kernel; it does
not run anything. What only running can tell it, it asks a :class:`LayoutOracle`: the strides
an extern's result has, and whether oneDNN accepts a call (with or without its post-ops). Two
oracles answer:

- :class:`~plait.codegen.probing_oracle.ProbingOracle` (a compile): runs each extern once on
  zeros to see its result's layout, and probes each oneDNN call.
- :class:`~plait.codegen.replaying_oracle.ReplayingOracle` (a warm start): answers from a
  :class:`~plait.codegen.plan.SavedLayouts`, the decisions a compile recorded; nothing runs.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((2, 3), torch.float32))
    >>> gb.output(gb.call("exp", x))
    >>> facts = PlanFacts.of(gb.build(), channels_last=True)
    >>> facts.device, facts.symbolic, facts.position
    (device(type='cpu'), False, {0: 0})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from plait.codegen.admission import graph_device
from plait.codegen.extern import ExternCall
from plait.codegen.onednn import PackedWeights, Prepacker
from plait.codegen.placement import Loc
from plait.codegen.plan import ExternStep
from plait.codegen.symbolic_shapes import hints_for, is_symbolic
from plait.ir.graph import Graph, Value
from plait.symbolic.poly import Size

Strides = tuple[Size, ...]


@dataclass(frozen=True)
class PlanFacts:
    """What the planner and its oracle both read off the graph: its device, its constant
    tensors, the representative sizes of its symbols (``hints``: dry runs run at them; see
    :mod:`plait.codegen.symbolic_shapes`) and each node's position in ``graph.nodes`` (what a
    saved plan is keyed by)."""

    graph: Graph
    device: torch.device
    channels_last: bool
    consts: Mapping[Value, torch.Tensor]
    symbolic: bool
    hints: Mapping[str, int]
    position: Mapping[int, int]

    @classmethod
    def of(cls, graph: Graph, channels_last: bool) -> PlanFacts:
        symbolic = is_symbolic(graph)
        consts = {
            v: graph.constants[v.name]
            for v in graph.inputs
            if v.kind == "const" and isinstance(graph.constants.get(v.name), torch.Tensor)
        }
        return cls(
            graph,
            torch.device(graph_device(graph)),
            channels_last,
            consts,
            symbolic,
            hints_for(graph) if symbolic else {},
            {n.id: i for i, n in enumerate(graph.nodes)},
        )


class LayoutOracle(Protocol):
    """Answers the planner's questions about extern calls. ``locs`` in each question: the
    locations the planner has decided so far (every operand of the step has one)."""

    # NOTE: the oneDNN calls refused, by node position and stage ("fused", "onednn"): reason
    refused: dict[int, dict[str, str]]
    # NOTE: the weights prepacked for oneDNN, and the reorders running in the background
    packs: PackedWeights
    prepack: Prepacker | None
    # NOTE: whether the answers came from a saved plan (nothing probed)
    replayed: bool

    def start(self, live: set[int], deferred: Mapping[int, int]) -> None:
        """Before the planner walks the nodes: the live node ids, and the hosts whose call is
        emitted at another node (host id -> that node's id: an extern with an epilogue)."""
        ...

    def at_node(self, position: int) -> None:
        """The planner reached the node at ``position`` in ``graph.nodes``."""
        ...

    def laid_out(self, v: Value, strides: Strides) -> None:
        """``v`` is materialized with ``strides`` (a graph input, a kernel's store, a fallback's
        or a data-dependent call's result)."""
        ...

    def result_strides(self, step: ExternStep, locs: Mapping[Value, Loc]) -> list[Strides]:
        """The strides of each of ``step``'s results."""
        ...

    def decide(self, step: ExternStep, stage: str, locs: Mapping[Value, Loc]) -> str | None:
        """Whether oneDNN accepts ``step`` (``stage``: with its post-ops or alone): ``None``,
        with ``step.out_strides`` set, or the reason it refused (recorded in ``refused``)."""
        ...

    def accepted_note(self, call: ExternCall) -> str:
        """What the node's tag says of an accepted oneDNN call ("" when nothing)."""
        ...

    def close(self, finished: bool) -> None:
        """The plan is done (``finished``) or abandoned: background work ends."""
        ...

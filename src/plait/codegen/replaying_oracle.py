"""The replaying layout oracle: a warm start's answers, read from a saved plan.

A :class:`~plait.codegen.plan.SavedLayouts` holds each extern result's strides and the oneDNN
calls the compile saw refused; replaying them makes the same plan without running an extern on
zeros or probing a oneDNN call (the cache key pins what decided them: PyTorch's build, the CPU,
the options). Since nothing runs a call while planning, the weight reorders run in threads
meanwhile (:class:`~plait.codegen.onednn.Prepacker`), waiting for the saved plan's deferred
hash check (``gate``) where it has one.

Example:
    >>> import torch
    >>> from plait.codegen.fusion import plan_graph
    >>> from plait.codegen.saved_layouts import extern_layouts
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> w = gb.input("w", TensorType((8, 8), torch.float32))
    >>> gb.output(gb.call("linear", x, w))
    >>> g = gb.build()
    >>> saved = extern_layouts(plan_graph(g))
    >>> plan_graph(g, layouts=saved).from_saved_plan
    True
"""

from __future__ import annotations

from collections.abc import Mapping

from plait.codegen.extern import ExternCall
from plait.codegen.layout_oracle import PlanFacts, Strides
from plait.codegen.onednn import PackedWeights, Prepacker
from plait.codegen.placement import Loc
from plait.codegen.plan import ExternStep, SavedLayouts
from plait.codegen.saved_layouts import restored_strides
from plait.ir.graph import Value

SAVED = "(from the saved plan, not probed)"


class ReplayingOracle:
    """A :class:`~plait.codegen.layout_oracle.LayoutOracle` answering from ``saved``."""

    replayed = True

    def __init__(self, facts: PlanFacts, saved: SavedLayouts) -> None:
        self._facts = facts
        self._saved = saved
        self.refused: dict[int, dict[str, str]] = {}
        # NOTE: with a gate, the saved weights are views of an entry still being verified:
        # none is imported (the caller imports them after the check) and reorders wait for it
        self.prepack: Prepacker | None = Prepacker(gate=saved.gate)
        self.packs = PackedWeights(saved.packed, deferred=saved.gate is not None)

    def start(self, live: set[int], deferred: Mapping[int, int]) -> None:
        pass

    def at_node(self, position: int) -> None:
        pass

    def laid_out(self, v: Value, strides: Strides) -> None:
        pass

    def result_strides(self, step: ExternStep, locs: Mapping[Value, Loc]) -> list[Strides]:
        saved = self._saved[self._facts.position[step.node.id]]
        return [restored_strides(v, s) for v, s in zip(step.outputs, saved)]

    def decide(self, step: ExternStep, stage: str, locs: Mapping[Value, Loc]) -> str | None:
        position = self._facts.position[step.node.id]
        reason = self._saved.refused.get(position, {}).get(stage)
        if reason is None:
            step.out_strides = self.result_strides(step, locs)
            return None
        self.refused.setdefault(position, {})[stage] = reason
        return f"{reason} {SAVED}"

    def accepted_note(self, call: ExternCall) -> str:
        return f"accepted by {call.library} at compile time {SAVED}"

    def close(self, finished: bool) -> None:
        if self.prepack is not None:
            self.prepack.close(finish=finished)

"""A Stax plan: where each value lives, and the steps that compute them (native kernels, extern
calls, fallbacks), as :func:`plait.codegen.fusion.plan_graph` decides them; and a saved plan's
decisions, which replay a compile without running anything.

Example:
    >>> import torch
    >>> from plait.codegen.fusion import plan_graph
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4,), torch.float32))
    >>> gb.output(gb.call("exp", x))
    >>> plan = plan_graph(gb.build())
    >>> [type(s).__name__ for s in plan.steps], plan.locs[x].kind
    (['KernelStep'], 'input')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from plait.codegen.extern import ExternCall
from plait.codegen.onednn import PackedWeights, SavedPack
from plait.codegen.placement import Loc, Lowered
from plait.ir.graph import Graph, Node, Operand, Value
from plait.symbolic.poly import Size


@dataclass
class NodeTag:
    """What executed a node: ``native`` (a C++ kernel, or a view: index arithmetic), ``extern``
    (a PyTorch kernel by design), ``fallback`` (PyTorch, because Stax cannot), ``dead``."""

    executor: str
    detail: str


@dataclass
class KernelStep:
    lowered: Lowered
    outputs: list[Value]


@dataclass
class ExternStep:
    """An extern call of ``node``; with ``fused`` pointwise nodes run as its post-ops (reading
    ``extra`` operands), the step's result is the last fused node's output."""

    node: Node
    call: ExternCall
    out_strides: list[tuple[Size, ...]]
    fused: tuple[Node, ...] = ()
    extra: tuple[Value, ...] = ()
    # NOTE: the call a timed step is measured against (codegen.timed_matmul; None: PyTorch's
    # kernel for its node). Read at compile time only; a saved plan keeps the decision.
    rival: ExternCall | None = None
    # NOTE: pointwise nodes before ``node`` that the call computes too (codegen.depthwise_conv:
    # the input activation and zero pad), and what the call reads in place of the node's inputs
    # then (the first prologue node's input); None: the node's inputs
    prologue: tuple[Node, ...] = ()
    inputs: tuple[Operand, ...] | None = None

    def node_inputs(self) -> list[Operand]:
        """The operands the call takes for its node's inputs."""
        return list(self.node.inputs if self.inputs is None else self.inputs)

    def operands(self) -> list[Operand]:
        return [*self.node_inputs(), *self.extra]

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.fused[-1].outputs if self.fused else self.node.outputs


@dataclass
class FallbackStep:
    node: Node
    reason: str


Step = KernelStep | ExternStep | FallbackStep

# NOTE: what a oneDNN decision is about: the call with its post-ops ("fused"), or the call alone
# ("onednn", after the fused one was refused or when there was no epilogue), or a product timed
# against PyTorch's kernel ("timed": codegen.timed_matmul.STAGE), or plait's native call
# (codegen.depthwise_plan.STAGE).
STAGES = ("fused", "onednn", "timed", "native")


class SavedLayouts(dict[int, list[tuple[int, ...]]]):
    """A saved plan: each extern step's result strides by node position (the mapping), and the
    oneDNN calls refused at compile time (``refused``: position -> stage -> reason). Given to
    :func:`plan_graph`, it replays the compile's decisions: no extern runs on zeros, no oneDNN
    call is probed (the cache key pins what decided them: PyTorch's build, the CPU, options).
    ``packed``: the constant weights the compile prepacked, as bytes (loaded, not reordered).
    ``gate``: where the constants and ``packed`` are views of a cache entry whose hash is still
    being checked, what returns once it is verified (raising where it is not): the plan then
    imports no saved weight (the caller runs ``plan.packs.import_deferred()`` after the check)
    and its reorders wait for it. ``printed``: the compile's kernel texts by
    :func:`~plait.codegen.kernel_digest.structure_digest` (a kernel of one of them is not
    printed again)."""

    def __init__(
        self,
        layouts: Mapping[int, Sequence[Sequence[int]]],
        refused: Mapping[int, Mapping[str, str]] | None = None,
        packed: Mapping[str, SavedPack] | None = None,
        gate: Callable[[], object] | None = None,
        printed: Mapping[str, str] | None = None,
    ) -> None:
        saved = {int(k): [tuple(int(x) for x in s) for s in v] for k, v in layouts.items()}
        super().__init__(saved)
        self.refused = {int(k): dict(v) for k, v in (refused or {}).items()}
        self.packed = dict(packed or {})
        self.gate = gate
        self.printed = dict(printed or {})


@dataclass
class Plan:
    graph: Graph
    locs: dict[Value, Loc]
    steps: list[Step]
    tags: dict[int, NodeTag]
    fallbacks: dict[int, str] = field(default_factory=dict)
    # NOTE: extern nodes whose oneDNN fusion (or oneDNN call) was refused at compile time, with
    # the reason; they run on the slower unfused path.
    unfused: dict[int, str] = field(default_factory=dict)
    # NOTE: the same refusals by node position and stage (they survive the IR's text round
    # trip; ids need not), for the saved plan; and whether they came from one (not probed).
    refused: dict[int, dict[str, str]] = field(default_factory=dict)
    from_saved_plan: bool = False
    # NOTE: the constant weights prepacked for oneDNN (saved ones imported, the rest made).
    packs: PackedWeights = field(default_factory=PackedWeights)
    # NOTE: extern nodes whose activation is not a oneDNN post-op because oneDNN computes it
    # differently from eager on special values (NaN, inf, signed zero): it runs natively.
    exactness: dict[int, str] = field(default_factory=dict)

    @property
    def kernels(self) -> list[Lowered]:
        return [s.lowered for s in self.steps if isinstance(s, KernelStep)]

"""Where the planner gives a convolution one of plait's native kernels: a depthwise one
(:mod:`plait.codegen.depthwise_conv`), a 1x1 one (:mod:`plait.codegen.pointwise_native`, which
also runs a linear of few rows) or a network's stem (:mod:`plait.codegen.stem_conv`); which nodes
each such call folds in, and its step.

The nodes a call folds in (the zero pad before a depthwise or stem call, and a depthwise call's
input activation; the residual add and activation after a call) are claimed before any oneDNN
epilogue is looked for, and are computed by no other step: the planner skips them where they
stand and gives their results no buffer (only the call read them). The step reads the first
folded node's input in place of the convolution's (``ExternStep.inputs``), and the residual as
an extra operand, and writes the last folded node's result. A call that adds a residual is
emitted where its add stands (the residual may be computed after the convolution), any other
where its convolution stands.

Example:
    >>> import torch
    >>> from plait.codegen.fusion import plan_graph
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((1, 16, 8, 8), torch.float32))
    >>> w = gb.input("w", TensorType((16, 1, 3, 3), torch.float32))
    >>> y = gb.call("conv2d", gb.call("relu", x), w, None, stride=[1, 1], padding=[1, 1],
    ...             dilation=[1, 1], groups=16)
    >>> gb.output(gb.call("clamp", y, min=0.0, max=6.0))
    >>> plan = plan_graph(gb.build())
    >>> [type(s).__name__ for s in plan.steps], [t.executor for t in plan.tags.values()]
    (['ExternStep'], ['native', 'native', 'native'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plait.codegen import depthwise_conv, global_pool, pointwise_native, stem_conv
from plait.codegen.depthwise_conv import (
    Depthwise,
    PooledMeans,
    depthwise_call,
    find_depthwise,
    means_die_in_call,
    pooled_call,
)
from plait.codegen.errors import BuildError
from plait.codegen.extern_call import ExternCall
from plait.codegen.placement import Loc
from plait.codegen.plan import ExternStep, NodeTag
from plait.codegen.pointwise_native import Pointwise, find_pointwise, pointwise_call
from plait.codegen.stem_conv import Stem, find_stem, stem_call

if TYPE_CHECKING:
    from plait.codegen.fusion import _Planner
    from plait.ir.graph import Node

# NOTE: the oracle stage of a native convolution call (a dry run that raised refuses it)
STAGE = "native"
# NOTE: the kernels by name, as StaxOptions turns them on and off
KINDS = ("depthwise", "pointwise", "stem", "global_pool")


@dataclass(frozen=True)
class Pooled:
    """A global average pool: of a depthwise call's result, whose means that call writes
    (:class:`~plait.codegen.depthwise_conv.PooledMeans`), its step handing them over; or, with
    no ``conv``, of any map, by its own kernel (:mod:`plait.codegen.global_pool`)."""

    host: Node
    conv: Depthwise | None
    prologue: tuple[Node, ...] = ()
    epilogue: tuple[Node, ...] = ()

    @property
    def source(self) -> Any:
        return self.host.inputs[0]

    @property
    def output(self) -> Any:
        return self.host.outputs[0]


Native = Depthwise | Pointwise | Stem | Pooled


def _find(node: Node, planner: _Planner, kind: str) -> Native | None:
    args = (planner.users, planner.outputs, planner.live)
    if kind == "depthwise":
        return find_depthwise(node, *args)
    if kind == "stem":
        return find_stem(node, *args, taken=planner.fused_into)
    if kind == "global_pool":
        pool = global_pool.find_global_pool(node)
        return Pooled(pool, None) if pool is not None else None
    return find_pointwise(node, *args, taken=planner.fused_into)


def _call(spec: Native, consts: Any, pooled: PooledMeans | None) -> ExternCall:
    if isinstance(spec, Pointwise):
        return pointwise_call(spec, consts)
    if isinstance(spec, Stem):
        return stem_call(spec, consts)
    if isinstance(spec, Pooled):
        return global_pool.global_pool_call(spec.host)
    assert isinstance(spec, Depthwise)
    return depthwise_call(spec, consts, pooled)


def _eager(spec: Native) -> Any:
    if isinstance(spec, Pointwise):
        return pointwise_native.eager_ops(spec)
    if isinstance(spec, Stem):
        return stem_conv.eager_ops(spec)
    if isinstance(spec, Pooled):
        return depthwise_conv.pool_ops(spec.host)
    return depthwise_conv.eager_ops(spec)


def claim(planner: _Planner, kinds: tuple[str, ...]) -> dict[int, tuple[Native, ExternCall]]:
    """Each live convolution a native kernel of ``kinds`` computes, by node id, with its call;
    the nodes it folds in become ``fused`` into it. A kernel that cannot be built leaves its
    convolution to oneDNN, the reason recorded with the node's unfused notes."""
    found: dict[int, tuple[Native, ExternCall]] = {}
    # NOTE: depthwise calls first: an activation between a 1x1 convolution and a depthwise one
    # is the depthwise call's (its kernel folds the zero pad after it only with it)
    order = [(k, n) for k in KINDS if k in kinds for n in planner.graph.nodes]
    for kind, node in order:
        if node.id not in planner.live or node.id in found:
            continue
        spec = _find(node, planner, kind)
        if spec is None or any(n.id in planner.fused_into for n in folded(spec)):
            continue
        dw = spec if isinstance(spec, Depthwise) and spec.pool is not None else None
        pooled = None
        if dw is not None:
            keep = means_die_in_call(dw, planner.users, planner.outputs, planner.live)
            pooled = PooledMeans.of(dw, keep)
        try:
            call = _call(spec, planner.facts.consts, pooled)
        except BuildError as e:
            planner.unfused[node.id] = f"native convolution kernel not built ({e})"
            continue
        found[node.id] = (spec, call)
        if dw is not None and dw.pool is not None and pooled is not None:
            found[dw.pool.id] = (Pooled(dw.pool, dw), pooled_call(dw, pooled))
        for n in folded(spec):
            planner.fused_into[n.id] = node
            planner.kinds[n.id] = ("fused", "")
    return found


def folded(spec: Native) -> tuple[Node, ...]:
    return (*spec.prologue, *spec.epilogue)


def at(spec: Native) -> Node:
    """Where the step of ``spec`` is emitted: at its residual add, else at its convolution."""
    return spec.epilogue[0] if isinstance(spec, Pointwise) and spec.other is not None else spec.host


def read_at(claimed: dict[int, tuple[Native, ExternCall]]) -> dict[int, int]:
    """Where each folded prologue node's operands, and each deferred convolution's, are read:
    at the step (the layout oracle keeps their samples until then)."""
    found = {n.id: host for host, (spec, _) in claimed.items() for n in spec.prologue}
    found.update({h: at(s).id for h, (s, _) in claimed.items() if at(s) is not s.host})
    return found


def emit(planner: _Planner, node: Node) -> None:
    """The step of convolution ``node`` (claimed by :func:`claim`; or of a pool whose means a
    depthwise call writes): the native call, or, where its dry run raised, eager's ops for the
    same nodes (the reason in its detail)."""
    dw, call = planner.native_convs[node.id]
    planner.close()
    inputs = (dw.source, *node.inputs[1:])
    extra = dw.extra if isinstance(dw, Pointwise) else ()
    step = ExternStep(node, call, [], dw.epilogue, extra, prologue=dw.prologue, inputs=inputs)
    failure = planner.oracle.decide(step, STAGE, planner.locs)
    executor = "native"
    if failure is not None:
        op_class = "reduction" if isinstance(dw, Pooled) else "conv"
        eager = ExternCall(_eager(dw), op_class, f"eager's ops ({failure})")
        step = ExternStep(node, eager, [], dw.epilogue, extra, prologue=dw.prologue, inputs=inputs)
        step.out_strides = planner.oracle.result_strides(step, planner.locs)
        planner.unfused[node.id] = failure
        executor = "extern"
        if isinstance(dw, Depthwise) and dw.pool is not None and dw.pool.id in planner.native_convs:
            # NOTE: no native call writes the means (nor a kept tensor): the pool step pools
            # the map eager's ops wrote (its step comes after this one)
            pool = planner.native_convs[dw.pool.id][0]
            planner.native_convs[dw.pool.id] = (pool, pooled_call(dw, PooledMeans.of(dw, False)))
    planner.steps.append(step)
    planner.tags[node.id] = NodeTag(executor, f"{step.call.detail} ({step.call.op_class})")
    linear = isinstance(dw, Pointwise) and dw.linear
    for n in (*dw.prologue, *dw.epilogue):
        what = f"folded into node {node.id}'s native {'linear' if linear else 'convolution'} call"
        planner.tags[n.id] = NodeTag(executor, what)
        for v in n.outputs:
            planner.locs[v] = Loc("inline")
    if dw.epilogue:
        planner.locs[node.outputs[0]] = Loc("inline")
    out = dw.output
    planner.locs[out] = Loc("buffer", out, 0, step.out_strides[0])

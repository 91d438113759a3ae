"""Where the planner gives a depthwise convolution plait's native kernel
(:mod:`plait.codegen.depthwise_conv`): which nodes each such call folds in, and its step.

The nodes a call folds in (the input activation and zero pad before it, the activation after
it) are claimed before any oneDNN epilogue is looked for, and are computed by no other step: the
planner skips them where they stand and gives their results no buffer (only the call read
them). The step reads the first folded node's input in place of the convolution's
(``ExternStep.inputs``), and writes the last folded node's result.

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

from typing import TYPE_CHECKING

from plait.codegen.depthwise_conv import Depthwise, depthwise_call, eager_ops, find_depthwise
from plait.codegen.errors import BuildError
from plait.codegen.extern_call import ExternCall
from plait.codegen.placement import Loc
from plait.codegen.plan import ExternStep, NodeTag

if TYPE_CHECKING:
    from plait.codegen.fusion import _Planner
    from plait.ir.graph import Node

# NOTE: the oracle stage of a native depthwise call (a dry run that raised refuses it)
STAGE = "native"


def claim(planner: _Planner) -> dict[int, tuple[Depthwise, ExternCall]]:
    """Each live depthwise convolution the kernel computes, by node id, with its call; the nodes
    it folds in become ``fused`` into it. A kernel that cannot be built leaves its convolution
    to oneDNN, the reason recorded with the node's unfused notes."""
    found: dict[int, tuple[Depthwise, ExternCall]] = {}
    for node in planner.graph.nodes:
        if node.id not in planner.live:
            continue
        dw = find_depthwise(node, planner.users, planner.outputs, planner.live)
        if dw is None or any(n.id in planner.fused_into for n in (*dw.prologue, *dw.epilogue)):
            continue
        try:
            call = depthwise_call(dw, planner.facts.consts)
        except BuildError as e:
            planner.unfused[node.id] = f"native depthwise kernel not built ({e})"
            continue
        found[node.id] = (dw, call)
        for n in (*dw.prologue, *dw.epilogue):
            planner.fused_into[n.id] = node
            planner.kinds[n.id] = ("fused", "")
    return found


def read_at(claimed: dict[int, tuple[Depthwise, ExternCall]]) -> dict[int, int]:
    """Where each folded prologue node's operands are read: at its convolution's step (the
    layout oracle keeps their samples until then)."""
    return {n.id: host for host, (dw, _) in claimed.items() for n in dw.prologue}


def emit(planner: _Planner, node: Node) -> None:
    """The step of depthwise convolution ``node`` (claimed by :func:`claim`): the native call,
    or, where its dry run raised, eager's ops for the same nodes (the reason in its detail)."""
    dw, call = planner.depthwise[node.id]
    planner.close()
    inputs = (dw.source, *node.inputs[1:])
    step = ExternStep(node, call, [], dw.epilogue, prologue=dw.prologue, inputs=inputs)
    failure = planner.oracle.decide(step, STAGE, planner.locs)
    executor = "native"
    if failure is not None:
        eager = ExternCall(eager_ops(dw), "conv", f"eager's ops ({failure})")
        step = ExternStep(node, eager, [], dw.epilogue, prologue=dw.prologue, inputs=inputs)
        step.out_strides = planner.oracle.result_strides(step, planner.locs)
        planner.unfused[node.id] = failure
        executor = "extern"
    planner.steps.append(step)
    planner.tags[node.id] = NodeTag(executor, f"{step.call.detail} (conv)")
    for n in (*dw.prologue, *dw.epilogue):
        what = f"folded into node {node.id}'s depthwise call"
        planner.tags[n.id] = NodeTag(executor, what)
        for v in n.outputs:
            planner.locs[v] = Loc("inline")
    if dw.epilogue:
        planner.locs[node.outputs[0]] = Loc("inline")
    out = dw.output
    planner.locs[out] = Loc("buffer", out, 0, step.out_strides[0])

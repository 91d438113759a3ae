"""Finding the first node the Stax backend computes wrong.

The program runs with its runner in trace mode (:func:`plait.runtime.runner.build_runner`'s
``trace``): after each step (a kernel, an extern call, a fallback) every value the step
materialized is judged against the reference interpreter's value on the same inputs, under the
contract row of the step's nodes, and then overwritten with the reference value, so the next
steps read exact inputs and each step is judged on its own work. A step that fuses several
nodes is narrowed by compiling the graph again unfused (``StaxOptions(fuse=False)``): the first
divergent node there is the one reported; when the unfused program is right, the fused kernel
is blamed, with its nodes.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.runtime import StaxOptions
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((8,), torch.float32))
    >>> gb.output(gb.call("exp", gb.call("mul", x, 3.0)))
    >>> found = localize_backend(gb.build(), StaxOptions(), {"x": torch.randn(8)})
    >>> found is None or not found.exceeded  # nothing beyond its contract row
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from plait.codegen.plan import ExternStep, FallbackStep, KernelStep
from plait.diagnose.judging import Measure, judge_value, op_class_of, share_of_budget
from plait.diagnose.replay import Divergence, closest_measure, raised
from plait.diagnose.values import evaluate, producers
from plait.ir import Graph, Node
from plait.runtime import StaxOptions, compile_graph
from plait.runtime.program import StaxProgram
from plait.runtime.runner import build_runner
from plait.runtime.runner_emit import step_outputs


def program_inputs(graph: Graph, inputs: Mapping[str, Any]) -> list[Any]:
    """The values a program of ``graph`` is called with, in input order (constants included)."""
    return [inputs[v.name] if v.name in inputs else graph.constants[v.name] for v in graph.inputs]


def step_nodes(program: StaxProgram, k: int) -> list[int]:
    step = program.plan.steps[k]
    if isinstance(step, KernelStep):
        return list(step.lowered.kernel.nodes)
    if isinstance(step, ExternStep):
        return [*(n.id for n in step.prologue), step.node.id, *(n.id for n in step.fused)]
    assert isinstance(step, FallbackStep)
    return [step.node.id]


def step_name(program: StaxProgram, k: int) -> str:
    step = program.plan.steps[k]
    if isinstance(step, KernelStep):
        return f"kernel {step.lowered.kernel.name}"
    if isinstance(step, ExternStep):
        return f"extern call of node {step.node.id} ({step.node.op})"
    return f"fallback node {step.node.id}"


def traced_run(
    program: StaxProgram, inputs: Mapping[str, Any], reference: Mapping[str, Any]
) -> Divergence | None:
    """Run ``program`` traced and resynchronized; the first divergent step's value (or, when
    none breaks its budget, the closest; None when all are equal)."""
    graph = program.graph
    by_id = {n.id: n for n in graph.nodes}
    made = producers(graph)
    found: list[Divergence] = []
    closest: list[Divergence] = []
    done = [-1]

    def trace(k: int, tensors: tuple[Any, ...]) -> None:
        done[0] = k
        step = program.plan.steps[k]
        nodes = [by_id[i] for i in step_nodes(program, k) if i in by_id]
        classes = [op_class_of(n) for n in nodes]
        for v, t in zip(step_outputs(step), tensors):
            expected = reference[v.name]
            if not found:
                measure = judge_value(expected, t, classes, f"%{v.name}")
                share = share_of_budget(expected, t, classes)
                node = made.get(v.name)
                kernel = step_name(program, k) if len(nodes) > 1 else None
                if measure is not None:
                    found.append(Divergence(node, "program", v.name, measure, True, share,
                                            kernel=kernel))  # fmt: skip
                elif share > 0 and (not closest or share > closest[0].share):
                    closest[:] = [Divergence(node, "program", v.name,
                                             closest_measure(f"%{v.name}", share), False, share,
                                             kernel=kernel)]  # fmt: skip
            if isinstance(t, torch.Tensor) and isinstance(expected, torch.Tensor):
                with torch.no_grad():
                    t.copy_(expected)  # NOTE: resynchronized

    runner = build_runner(
        program.plan, program.memory_plan, program._funcs, True,
        launch=program.target == "triton", trace=trace,
    )  # fmt: skip
    try:
        runner.fn(*program_inputs(graph, inputs))
    except Exception as exc:
        if found:
            return found[0]
        k = done[0] + 1
        ids = step_nodes(program, k) if k < len(program.plan.steps) else []
        node = by_id.get(ids[0]) if ids else None
        d = raised(exc, node)
        d.kernel = step_name(program, k) if k < len(program.plan.steps) else None
        return d
    if found:
        return found[0]
    return closest[0] if closest else None


def alias_divergence(program: StaxProgram, inputs: Mapping[str, Any]) -> Divergence | None:
    """An output that a second call returns in the first call's storage (the caller's own
    inputs excepted): the program hands out memory it keeps (a constant, an arena buffer)."""
    graph = program.graph
    args = program_inputs(graph, inputs)
    own = {
        x.untyped_storage().data_ptr()
        for v, x in zip(graph.inputs, args)
        if isinstance(x, torch.Tensor) and v.name not in graph.constants
    }
    first = program(*args)
    second = program(*args)
    made = producers(graph)
    for i, (a, b) in enumerate(zip(first, second)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.numel():
            continue
        ptr = b.untyped_storage().data_ptr()
        if ptr == a.untyped_storage().data_ptr() and ptr not in own:
            o = graph.outputs[i]
            name = getattr(o, "name", "")
            node = made.get(name)
            message = (
                f"output {i} (%{name}) is returned in the same storage on every call: a write "
                "to it changes what the program computes next"
            )
            return Divergence(node, "program", name, Measure("alias", f"output[{i}]",
                                                             "two calls", message))  # fmt: skip
    return None


def localize_backend(
    graph: Graph, options: StaxOptions, inputs: Mapping[str, Any]
) -> Divergence | None:
    """The first node of ``graph`` whose value the Stax program (built with ``options``)
    computes beyond its contract row, narrowed to one node where a fused step diverged."""
    reference = evaluate(graph, inputs)
    try:
        program = compile_graph(graph, options=options)
    except Exception as exc:
        return raised(exc)
    found = traced_run(program, inputs, reference)
    if found is None or not found.exceeded:
        return alias_divergence(program, inputs) or found
    if found.kernel is None or not options.fuse:
        return found
    try:
        unfused = compile_graph(graph, options=dataclasses.replace(options, fuse=False))
    except Exception as exc:
        found.note = f"an unfused build, to narrow it down, raised {type(exc).__name__}: {exc}"
        return found
    narrowed = traced_run(unfused, inputs, reference)
    if narrowed is not None and narrowed.exceeded and narrowed.node is not None:
        narrowed.kernel = found.kernel
        narrowed.note = f"found in {found.kernel}; narrowed to one node by an unfused build"
        return narrowed
    found.note = (
        f"diverges only fused: the unfused build computes it within the contract "
        f"({found.kernel}, nodes {_ids(program, found.node)})"
    )
    return found


def _ids(program: StaxProgram, node: Node | None) -> list[int]:
    for k in range(len(program.plan.steps)):
        ids = step_nodes(program, k)
        if node is not None and node.id in ids:
            return ids
    return []

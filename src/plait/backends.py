"""From a captured program to something that runs: passes, backend, guards, manifest.

A backend turns a :class:`~plait.frontend.program.CapturedProgram` into a :class:`Compiled`: an
executor with the captured graph's calling convention, the guards the compile added (frozen
parameters), and the specialization's manifest. ``eager`` runs the graph with the reference
interpreter; ``stax`` runs the pass pipeline and the Stax native executor.

Example:
    >>> sorted(BACKENDS)
    ['eager', 'stax']
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.errors import CaptureFallbackWarning, PlaitCompileError
from plait.frontend.guards import Guard
from plait.frontend.program import CapturedProgram, Executor
from plait.ir import Graph, interpret
from plait.manifest import Manifest
from plait.passes import INFERENCE_PIPELINE, TRAINING_PIPELINE, run_pipeline

KNOWN_OPTIONS = ("passes", "freeze", "stax")


@dataclass
class Compiled:
    executor: Executor | None
    manifest: Manifest
    guards: list[Guard] = field(default_factory=list)
    graph: Graph | None = None  # the graph the executor runs (after passes)
    program: Any = None  # the backend's own program (a StaxProgram), for profiling and explain


@dataclass
class CompileRequest:
    program: CapturedProgram
    backend: str
    fullgraph: bool
    options: dict[str, Any]
    state: Sequence[torch.Tensor]  # the module's parameters and buffers, in slot order


def _needs_grad(req: CompileRequest) -> bool:
    """Can a gradient flow through this call? Then nothing may freeze, and native kernels (no
    autograd until L4) cannot run it. The guards pin grad mode and every requires_grad read."""
    if not torch.is_grad_enabled():
        return False
    tensors = [*req.state, *(s.ref for s in req.program.inputs if s.source == "const")]
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        return True
    return any(g.kind == "requires_grad" and g.expected for g in req.program.guards)


def _pipeline(req: CompileRequest, freeze: bool) -> str:
    chosen = req.options.get("passes")
    if chosen is None:
        if req.backend == "eager":
            return ""
        return INFERENCE_PIPELINE if freeze else TRAINING_PIPELINE
    return {"inference": INFERENCE_PIPELINE, "training": TRAINING_PIPELINE, "none": ""}.get(
        chosen, chosen
    )


def _state_slots(prog: CapturedProgram, graph: Graph) -> dict[str, int]:
    """Graph input name -> index into the module state, for parameter and buffer inputs."""
    out = {}
    for v, slot in zip(graph.inputs, prog.inputs):
        if slot.source == "state":
            out[v.name] = slot.ref
    return out


def _frozen_guard(name: str, k: int, tensor: torch.Tensor) -> Guard:
    # NOTE: identity and version counter: replacing the tensor or writing it in place (an
    # optimizer step, load_state_dict) fails the guard, so a frozen value is never stale.
    expected = (id(tensor), tensor._version)
    return Guard(
        "state",
        name,
        f"{name} is the frozen tensor, unchanged (identity, version)",
        expected,
        lambda env: (id(env.state[k]), env.state[k]._version),
        fmt=lambda v: f"version {v[1]}" if isinstance(v, tuple) else repr(v),
    )


def _bind(graph: Graph, optimized: Graph) -> Callable[[list[Any]], list[Any]]:
    """Map the captured graph's input list onto the optimized graph's inputs (by name)."""
    index = {v.name: i for i, v in enumerate(graph.inputs)}
    plan: list[tuple[bool, Any]] = []
    for v in optimized.inputs:
        if v.name in optimized.constants:
            plan.append((False, optimized.constants[v.name]))
        else:
            plan.append((True, index[v.name]))
    return lambda values: [values[ref] if live else ref for live, ref in plan]


def _eager_executor(graph: Graph, optimized: Graph) -> Executor:
    bind = _bind(graph, optimized)

    def run(_: Graph, values: list[Any]) -> list[Any]:
        return interpret(optimized, bind(values), check_types=False)

    return run


def _stax_executor(
    req: CompileRequest, graph: Graph, optimized: Graph, m: Manifest
) -> tuple[Executor, Any]:
    from plait.runtime import CodegenError, StaxOptions, compile_graph

    settings = dict(req.options.get("stax") or {})
    settings.setdefault("strict", req.fullgraph)
    try:
        program = compile_graph(optimized, options=StaxOptions(**settings))
    except CodegenError as exc:
        raise PlaitCompileError(f"stax could not compile the graph: {exc}") from exc
    records = program.records()
    m.timings.update({f"stax.{k}": v for k, v in records.pop("timings", {}).items()})
    for k in records.get("kernels", []):
        name = k.get("name", "?")
        for key in ("build_seconds", "cache_hit"):
            if key in k:
                m.timings[f"stax.kernel.{name}.{key}"] = k.pop(key)
    m.kernels = {"kernels": records.pop("kernels", []), "schedule": records.pop("schedule", [])}
    m.toolchain["cxx"] = records.pop("toolchain", {})
    m.executor = records
    for n in records.get("evidence", {}).get("nodes", []):
        if n["executor"] == "fallback":
            m.fallbacks.append({"what": f"node {n['id']} ({n['op']})", "reason": n["detail"]})
    bind = _bind(graph, optimized)

    def run(_: Graph, values: list[Any]) -> list[Any]:
        return program(*bind(values))

    return run, program


def compile_program(req: CompileRequest) -> Compiled:
    """Run the pass pipeline and the backend for one specialization; build its manifest."""
    prog = req.program
    unknown = sorted(set(req.options) - set(KNOWN_OPTIONS))
    if unknown:
        raise ValueError(f"unknown compile options {unknown}; known: {list(KNOWN_OPTIONS)}")
    m = Manifest(source_hash=prog.semantic_hash or "", options=_options_record(req))
    m.guards = prog.guards.texts()
    m.fallbacks = [
        {"what": f"opaque {k} ×{v}", "reason": "no IR op; PyTorch runs the call"}
        for k, v in sorted(prog.opaque_counts.items())
    ]
    if prog.graph is None:
        m.fallbacks.append({"what": "whole program", "reason": prog.fallback_reason or "?"})
        return Compiled(None, m)
    graph = prog.graph
    needs_grad = _needs_grad(req)
    freeze = req.options.get("freeze")
    freeze = (not needs_grad) if freeze is None else bool(freeze)
    if freeze and needs_grad:
        raise ValueError(
            "freeze=True needs a call no gradient flows through (torch.no_grad(), "
            "or parameters and inputs that do not require grad)"
        )
    state = list(req.state)
    slots = _state_slots(prog, graph)
    params = {name: state[k] for name, k in slots.items()} if freeze else {}
    start = time.perf_counter()
    result = run_pipeline(
        graph, _pipeline(req, freeze), params=params, source_hash=prog.semantic_hash
    )
    m.timings["passes"] = time.perf_counter() - start
    m.passes = result.to_json()
    m.timings.update({f"pass.{k}": v for k, v in result.timings().items()})
    optimized = result.graph
    frozen = [
        n for rec in result.records if rec.name == "freeze" for n in rec.details.get("frozen", [])
    ]
    guards = [_frozen_guard(n, slots[n], state[slots[n]]) for n in frozen]
    m.guards += [g.text for g in guards]
    m.graph = {
        "nodes_captured": len(graph.nodes),
        "nodes_optimized": len(optimized.nodes),
        "frozen": frozen,
    }
    if req.backend == "stax" and needs_grad:
        reason = (
            "gradients can flow through this call and Stax kernels have no backward yet "
            "(L4): the reference interpreter runs the forward, eager autograd the backward"
        )
        warnings.warn(f"plait stax: {reason}", CaptureFallbackWarning, stacklevel=6)
        m.fallbacks.append({"what": "backend stax → eager interpreter", "reason": reason})
        m.executor = {"backend": "eager", "requested": "stax"}
        return Compiled(_eager_executor(graph, optimized), m, guards, optimized)
    if req.backend == "stax":
        start = time.perf_counter()
        executor, program = _stax_executor(req, graph, optimized, m)
        m.timings["backend"] = time.perf_counter() - start
        return Compiled(executor, m, guards, optimized, program)
    m.executor = {"backend": "eager", "evidence": {"counts": {"interpreted": len(optimized.nodes)}}}
    return Compiled(_eager_executor(graph, optimized), m, guards, optimized)


def _options_record(req: CompileRequest) -> dict[str, Any]:
    return {
        "backend": req.backend,
        "fullgraph": req.fullgraph,
        "dynamic": req.program.dynamic,
        **{k: v for k, v in sorted(req.options.items())},
    }


BACKENDS = ("eager", "stax")

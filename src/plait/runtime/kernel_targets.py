"""Which kernels a Stax graph gets, and what a CUDA program's Triton kernels need before their
first launch: the compile workers started when a cold compile begins (:func:`begin_compile`),
every kernel compiled ahead (:func:`precompile_triton`).

Example:
    >>> import torch
    >>> from plait.codegen import StaxOptions
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> gb.output(gb.call("neg", gb.input("x", TensorType((4,), torch.float32))))
    >>> resolve_target(gb.build(), StaxOptions())
    'cpu'
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from plait.codegen.errors import CodegenError
from plait.codegen.fusion import graph_device
from plait.codegen.options import StaxOptions
from plait.codegen.plan import KernelStep, Plan
from plait.ir.graph import Graph
from plait.ir.types import TensorType


def resolve_target(graph: Graph, options: StaxOptions) -> str:
    """The kernels ``graph`` gets: ``options.target``, where ``auto`` means C++ for CPU tensors
    and Triton for CUDA tensors."""
    if options.target != "auto":
        return options.target
    return "cpu" if graph_device(graph) == "cpu" else "triton"


def begin_compile(graph: Graph, options: StaxOptions | None = None) -> None:
    """Start what a cold compile of ``graph`` can start before its passes run: for a CUDA
    program's Triton kernels, the compile workers (:func:`plait.codegen.triton_pool.prestart`),
    so they are ready when its kernels are printed."""
    opts = options or StaxOptions()
    try:
        device, target = graph_device(graph), resolve_target(graph, opts)
    except CodegenError:
        return  # NOTE: the compile itself reports it
    if target != "triton" or device == "cpu":
        return  # NOTE: no Triton kernel: Triton's modules stay unloaded
    from plait.codegen import triton_pool
    from plait.codegen.triton_load import interpreting, torch_ptxas_once

    if not interpreting() and opts.jobs != 1:
        torch_ptxas_once()  # NOTE: the workers start in the environment the kernels compile in
        try:
            triton_pool.prestart(device, opts.jobs)
        except Exception as exc:  # NOTE: the compile goes on; its precompile records the rest
            warnings.warn(
                f"plait: Triton compile workers could not start ahead ({type(exc).__name__}: "
                f"{exc}); kernels compile when they are printed",
                RuntimeWarning,
                stacklevel=2,
            )


def launch_dtypes(low: Any) -> list[Any]:
    """The dtypes of the tensors a Triton kernel is launched with, in buffer order."""
    types = [v.type for v in low.bindings]
    assert all(isinstance(t, TensorType) for t in types)  # NOTE: launched with tensors
    return [t.dtype for t in types if isinstance(t, TensorType)]


def triton_launches(plan: Plan, row: Sequence[Any]) -> list[tuple[Any, list[Any]]]:
    """Each Triton kernel of ``plan`` (its infos ``row``, in step order) with its launch's
    tensor dtypes: what :func:`plait.codegen.triton_load.precompile` compiles."""
    steps = [s for s in plan.steps if isinstance(s, KernelStep)]
    return [(info.triton, launch_dtypes(step.lowered)) for info, step in zip(row, steps)]


def precompile_triton(
    graphs: Sequence[Graph],
    plans: Sequence[Plan],
    infos: Sequence[list[Any]],
    targets: Sequence[str],
    opts: StaxOptions,
) -> dict[str, Any]:
    """Every Triton kernel of ``graphs`` compiled before its first launch, ``opts.jobs`` (default:
    every CPU) at a time (:func:`plait.codegen.triton_load.precompile`)."""
    import os

    by_device: dict[str, list[tuple[Any, list[Any]]]] = {}
    for g, plan, row, target in zip(graphs, plans, infos, targets):
        if target != "triton" or graph_device(g) == "cpu":
            continue
        by_device.setdefault(graph_device(g), []).extend(triton_launches(plan, row))
    if not by_device:  # NOTE: no Triton kernel to compile: Triton's modules stay unloaded
        return {"kernels": 0, "jobs": 1, "parallel": False, "seconds": 0.0}
    from plait.codegen import triton_pool
    from plait.codegen.triton_load import precompile

    jobs = opts.jobs or os.cpu_count() or 1
    records = [precompile(kernels, device, jobs) for device, kernels in by_device.items()]
    out = {
        "kernels": sum(r["kernels"] for r in records),
        "jobs": max(r["jobs"] for r in records),
        "parallel": any(r["parallel"] for r in records),
        "seconds": sum(r["seconds"] for r in records),
    }
    for key in triton_pool.SUMMED:
        out[key] = sum(r.get(key, 0) for r in records)
    for key in triton_pool.LARGEST:
        if any(key in r for r in records):
            out[key] = max(r.get(key, 0.0) for r in records)
    worker_errors = [e for r in records for e in r.get("worker_errors", [])]
    if worker_errors:
        out["worker_errors"] = worker_errors
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        out["error"] = "; ".join(errors)
    return out

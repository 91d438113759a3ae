"""Training through Stax: a captured graph's forward and backward, compiled and tied into
PyTorch's autograd.

:func:`compile_training` builds the joint graph of a (pass-optimized) forward graph with respect
to the inputs that require grad (:mod:`plait.autograd`), partitions it, runs the pass pipeline on
each half (on the Triton target ``fuse-bn-relu`` and ``pad-products`` too), and compiles both
with Stax (kernels built together). The result is called with the
forward graph's inputs and returns its outputs, attached to PyTorch's autograd graph: the
compiled backward runs when PyTorch's engine reaches the call.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> b = GraphBuilder()
    >>> x = b.input("x", TensorType((4,), torch.float32))
    >>> w = b.param("w", TensorType((4,), torch.float32))
    >>> b.output(b.call("relu", b.call("mul", x, w)))
    >>> prog = compile_training(b.build(), wrt=["w"])
    >>> w_ = torch.ones(4, requires_grad=True)
    >>> prog([torch.arange(4.0), w_])[0].sum().backward()
    >>> w_.grad.tolist()
    [0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from plait.autograd import CompiledAutograd, Partition, build_joint, partition
from plait.autograd.joint import prepare_for_autograd
from plait.autograd.partition import PartitionError, value_bytes
from plait.codegen.datadep import unbacked
from plait.codegen.options import StaxOptions
from plait.ir.graph import Graph
from plait.passes import TRAINING_PIPELINE, PipelineResult, run_pipeline
from plait.runtime.kernel_targets import resolve_target
from plait.runtime.program import StaxProgram, compile_graphs


class TrainingProgram:
    """A forward and a backward Stax program behind one ``torch.autograd.Function``."""

    def __init__(
        self,
        graph: Graph,
        part: Partition,
        programs: tuple[StaxProgram, StaxProgram],
        graphs: tuple[Graph, Graph],
        run: CompiledAutograd,
        seconds: dict[str, float],
        passes: tuple[PipelineResult, PipelineResult] | None = None,
    ) -> None:
        self.graph = graph  # the forward graph as given (its inputs are the call's)
        self.partition = part
        self.forward, self.backward = programs
        self.forward_graph, self.backward_graph = graphs  # after passes
        self.run = run
        self.seconds = seconds
        # NOTE: the pipeline each half ran after the partition (records and graphs)
        self.passes = passes

    def __call__(self, values: list[Any]) -> list[Any]:
        return self.run(values)

    def records(self) -> dict[str, Any]:
        """The partition and both programs' records, for the manifest."""
        p = self.partition
        out = {
            "partitioner": p.partitioner,
            "saved": [
                {"name": v.name, "type": str(v.type), "bytes": value_bytes(v)} for v in p.saved
            ],
            "saved_bytes": p.saved_bytes,
            "recomputed_nodes": p.recomputed,
            "renormalized_batch_norms": p.renormalized,
            "forward_nodes": len(self.forward_graph.nodes),
            "backward_nodes": len(self.backward_graph.nodes),
            "wrt": [self.graph.inputs[i].name for i in self.run.grads],
            "forward": self.forward.records(),
            "backward": self.backward.records(),
            "timings": dict(self.seconds),
        }
        if self.passes is not None:  # NOTE: each half's passes, as the manifest has every pass
            out["passes"] = {
                "forward": self.passes[0].to_json(),
                "backward": self.passes[1].to_json(),
            }
        return out


def _bound(before: Graph, after: Graph) -> Any:
    """Call ``after``'s program with ``before``'s input list (passes may drop inputs)."""
    index = {v.name: i for i, v in enumerate(before.inputs)}
    plan = [
        (False, after.constants[v.name]) if v.name in after.constants else (True, index[v.name])
        for v in after.inputs
    ]
    return lambda values: [values[ref] if live else ref for live, ref in plan]


def _saved_sources(part: Partition, halves: list[Graph]) -> dict[int, int] | None:
    """The backward program's input positions that read a saved value, each with the forward
    program's output position that returns it (its outputs, then the saved values)."""
    if len(halves[0].outputs) != len(part.forward.outputs):
        return None  # NOTE: the passes kept every output; if not, no shared buffers
    n_outputs = len(part.forward.outputs) - len(part.saved)
    index = {v.name: i for i, v in enumerate(part.backward.inputs)}
    return {
        i: n_outputs + index[v.name]
        for i, v in enumerate(halves[1].inputs)
        if v.name not in halves[1].constants and index[v.name] < len(part.saved)
    }


def _static_handoff(part: Partition) -> None:
    """Raises :class:`PartitionError` when the backward would read a value of data-dependent
    size (boolean-mask indexing, say): a Stax program binds no such size from its inputs, so
    the compile falls back to eager autograd for the backward, as it says."""
    for v in part.backward.inputs:
        if unbacked(v.type):
            raise PartitionError(
                f"the backward reads %{v.name}: {v.type}, of data-dependent size (boolean-mask "
                "indexing, nonzero...): compiled backwards take static or symbolic sizes only"
            )


def _halves_pipeline(pipeline: str, forward: Graph, options: StaxOptions) -> str:
    """``pipeline``, and on the Triton target after it: ``fuse-bn-relu`` (plait's batch-norm
    kernels apply a ReLU and its mask as they read: codegen.cuda_batch_norm) and
    ``pad-products,dce`` (a 16-bit product with a dimension not a multiple of 8 reads operands
    padded once in the graph: a vocabulary head's gradient products share one padded
    cotangent; passes.pad_products)."""
    if resolve_target(forward, options) != "triton":
        return pipeline
    return ",".join(p for p in (pipeline, "fuse-bn-relu", "pad-products", "dce") if p)


def compile_training(
    graph: Graph,
    wrt: Sequence[str],
    *,
    differentiable_outputs: Sequence[int] | None = None,
    partitioner: str = "min-cut",
    pipeline: str = TRAINING_PIPELINE,
    options: StaxOptions | None = None,
    source_hash: str | None = None,
    name: str = "a plait-compiled program",
    resident: Mapping[str, Any] | None = None,
) -> TrainingProgram:
    """Compile ``graph``'s forward and backward with respect to the inputs named in ``wrt``.

    ``differentiable_outputs``: the outputs that may take a cotangent (default: all; a buffer
    update written back after the call is not one). ``resident``: the tensors the calls will
    pass for some inputs, by name (a module's parameters and buffers): on CUDA both graphs read
    them where they live instead of copying them in (:mod:`plait.runtime.cuda_graph`).
    """
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    prepared = prepare_for_autograd(graph, set(wrt))
    joint = build_joint(prepared, wrt, differentiable_outputs)
    seconds["joint"] = time.perf_counter() - start
    start = time.perf_counter()
    # NOTE: on the Triton target a batch norm's normalized result may be recomputed in the
    # backward (plait.autograd.renormalize): GPU memory held between the halves, at the cost
    # of a pointwise pass the backward's kernels fuse; the CPU keeps saving it
    triton = resolve_target(prepared, options or StaxOptions()) == "triton"
    part = partition(joint, partitioner, renormalize=triton)
    _static_handoff(part)
    seconds["partition"] = time.perf_counter() - start
    start = time.perf_counter()
    halves_pipeline = _halves_pipeline(pipeline, part.forward, options or StaxOptions())
    results = [
        run_pipeline(g, halves_pipeline, source_hash=source_hash)
        for g in (part.forward, part.backward)
    ]
    halves = [r.graph for r in results]
    seconds["passes"] = time.perf_counter() - start
    start = time.perf_counter()
    handoff = _saved_sources(part, halves) if (options or StaxOptions()).cuda_handoff else None
    at = [
        {i: resident[v.name] for i, v in enumerate(h.inputs) if v.name in resident}
        for h in halves
    ] if resident else None  # fmt: skip
    fwd, bwd = compile_graphs(halves, options=options, handoff=handoff, resident=at)
    seconds["stax"] = time.perf_counter() - start
    bind_fwd, bind_bwd = _bound(part.forward, halves[0]), _bound(part.backward, halves[1])
    run = CompiledAutograd(
        lambda values: fwd(*bind_fwd(values)),
        lambda values: bwd(*bind_bwd(values)),
        n_inputs=len(graph.inputs),
        n_outputs=len(graph.outputs),
        cotangents=joint.cotangents,
        grads=joint.grads,
        reaches=joint.reaches,
        name=name,
    )
    passes = (results[0], results[1])
    return TrainingProgram(graph, part, (fwd, bwd), (halves[0], halves[1]), run, seconds, passes)

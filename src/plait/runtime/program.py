"""``compile_graph``: an IR graph to a :class:`StaxProgram`, the Stax executor's callable.

Pipeline: plan (fusion, locations, externs) -> print each kernel to C++ -> build translation units
in parallel (content-addressed cache) -> memory plan -> straight-line runner.

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4, 8), torch.float32))
    >>> gb.output(gb.call("relu", gb.call("mul", x, 2.0)))
    >>> program = compile_graph(gb.build())
    >>> (y,) = program(torch.ones(4, 8))
    >>> float(y.sum()), program.evidence.counts["native"]
    (64.0, 2)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from plait.codegen.build import Unit, build_units, toolchain
from plait.codegen.cpp import PrintOptions, print_kernel
from plait.codegen.errors import CodegenError
from plait.codegen.fusion import extern_layouts, graph_device, plan_graph
from plait.codegen.kernel_digest import structure_digest
from plait.codegen.kir import Kernel
from plait.codegen.native_conv_plan import KINDS as NATIVE_CONVS
from plait.codegen.onednn import LOADED
from plait.codegen.options import StaxOptions
from plait.codegen.plan import KernelStep, NodeTag, Plan, SavedLayouts
from plait.ir.graph import Graph
from plait.progress import shown
from plait.runtime.kernel_targets import launch_dtypes, precompile_triton, resolve_target
from plait.runtime.memory import MemoryPlan, plan_memory
from plait.runtime.runner import Runner, build_runner

EXECUTORS = ("native", "extern", "fallback", "dead")
# NOTE: the fewest kernels a unit gets where a program's kernels are split across processes
SPLIT_KERNELS = 8


@dataclass
class Evidence:
    """What executed each node: ``native`` (C++ kernel or zero-copy view), ``extern``
    (PyTorch kernel by design), ``fallback`` (PyTorch because Stax cannot; with its reason),
    ``dead`` (unused, not run)."""

    nodes: dict[int, NodeTag]
    ops: dict[int, str]
    # NOTE: extern nodes run unfused because oneDNN refused the fused call at compile time.
    unfused: dict[int, str] = field(default_factory=dict)
    # NOTE: extern nodes whose activation runs natively: oneDNN's post-op differs from eager on
    # special values (NaN, inf, signed zero).
    exactness: dict[int, str] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(EXECUTORS, 0)
        for tag in self.nodes.values():
            out[tag.executor] += 1
        return out

    @property
    def fallbacks(self) -> dict[int, str]:
        return {n: t.detail for n, t in self.nodes.items() if t.executor == "fallback"}

    def records(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "nodes": [
                {"id": n, "op": self.ops[n], "executor": t.executor, "detail": t.detail}
                for n, t in sorted(self.nodes.items())
            ],
            "unfused": [{"id": n, "reason": r} for n, r in sorted(self.unfused.items())],
            "not_fused_for_exactness": [
                {"id": n, "reason": r} for n, r in sorted(self.exactness.items())
            ],
        }


@dataclass
class KernelInfo:
    name: str
    symbol: str
    template: str
    nodes: tuple[int, ...]
    source_sha256: str
    unit: str = ""
    build_seconds: float = 0.0
    cache_hit: bool = False
    epilogue_of: list[int] = field(default_factory=list)
    source: str = field(default="", repr=False)
    triton: Any = field(default=None, repr=False)  # NOTE: the TritonSource of a Triton kernel
    tuning: dict[str, Any] | None = None  # NOTE: how its launch shape was chosen (autotuned)
    printer: str = "cpp"  # NOTE: "cpp", "triton" or "tvm"
    fallback: str = ""  # NOTE: why the printer asked for (TVM) did not print it
    tvm: Any = field(default=None, repr=False)  # NOTE: the TvmKernel of a TVM kernel

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "symbol": self.symbol,
            "template": self.template,
            "nodes": list(self.nodes),
            "source_sha256": self.source_sha256,
            "unit": self.unit,
            "build_seconds": round(self.build_seconds, 6),
            "cache_hit": self.cache_hit,
            "epilogue_of": self.epilogue_of,
            "printer": self.printer,
            **({"fallback": self.fallback} if self.fallback else {}),
            **({"tuning": self.tuning} if self.tuning is not None else {}),
        }


class StaxProgram:
    """A compiled graph: call it with the graph's inputs (in input order); it returns the list of
    outputs. Outputs are fresh tensors owned by the caller (or the caller's own input, when the
    graph returns an input unchanged). Calls are serialized per program (the arena is shared).

    ``evidence`` (per node executor), ``kernels`` (name, nodes, source hash, build time, cache
    hit), ``memory_plan`` (buffers, arena and peak bytes) and ``records()`` (all of it, JSON) are
    what the manifest embeds.
    """

    def __init__(
        self,
        graph: Graph,
        plan: Plan,
        memory: MemoryPlan,
        kernels: list[KernelInfo],
        runner: Runner,
        options: StaxOptions,
        timings: dict[str, float],
        funcs: dict[int, Any],
        target: str = "cpu",
        borrow_from: tuple[StaxProgram, Mapping[int, int]] | None = None,
        resident: Mapping[int, Any] | None = None,
        lends: bool = False,
    ) -> None:
        self.graph = graph
        self.target = target
        self.plan = plan
        self.memory_plan = memory
        self.kernels = kernels
        self.options = options
        self.timings = timings
        # NOTE: how the Triton kernels were compiled before their first launch (triton_load)
        self.triton_precompile: dict[str, Any] | None = None
        self._runner = runner
        self._funcs = funcs
        self.source = runner.source
        self.evidence = Evidence(
            dict(plan.tags),
            {n.id: n.op for n in graph.nodes},
            dict(plan.unfused),
            dict(plan.exactness),
        )
        # NOTE: CUDA programs replay one CUDA graph of the runner where nothing in them syncs
        # with the host (runtime.cuda_graph); ``cuda_graph`` says whether it does, and why not
        self.cuda_graph: dict[str, Any] = {"used": False, "reason": "not a CUDA program"}
        call = runner.fn
        if target == "triton" and self.device.type == "cuda":
            from plait.runtime.cuda_graph import graphed

            call, self.cuda_graph = graphed(
                self, runner.fn, options.cuda_graphs, borrow_from, resident,
                options.cuda_shared_pool, lends,
            )  # fmt: skip
        # NOTE: Python looks ``__call__`` up on the class: the instance's choice is ``_call``
        self._call = call

    @property
    def runner(self) -> Runner:
        """The generated runner the program calls (through its CUDA graph, where it has one)."""
        return self._runner

    @property
    def device(self) -> Any:
        import torch

        return torch.device(graph_device(self.graph))

    def __call__(self, *inputs: Any) -> list[Any]:
        return self._call(*inputs)

    def schedule(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        names = iter(self.kernels)
        for step in self.plan.steps:
            if isinstance(step, KernelStep):
                out.append({"kind": "kernel", "name": next(names).name})
            else:
                kind = "extern" if type(step).__name__ == "ExternStep" else "fallback"
                out.append({"kind": kind, "node": step.node.id, "op": step.node.op})
        return out

    def profile(self, *inputs: Any, repeat: int = 10) -> list[dict[str, Any]]:
        """Mean wall seconds per schedule step over ``repeat`` calls (after one warm-up call),
        from an instrumented copy of the runner: what dominates a call.

        Example:
            >>> import torch
            >>> from plait.ir import GraphBuilder, TensorType
            >>> gb = GraphBuilder()
            >>> x = gb.input("x", TensorType((8,), torch.float32))
            >>> gb.output(gb.call("exp", x))
            >>> steps = compile_graph(gb.build()).profile(torch.ones(8), repeat=2)
            >>> [(s["kind"], s["seconds"] > 0) for s in steps]
            [('kernel', True)]
        """
        runner = build_runner(
            self.plan, self.memory_plan, self._funcs, True, profile=True,
            launch=self.target == "triton",
        )  # fmt: skip
        runner.fn(*inputs)
        totals = runner.globals["_P"]
        for i in range(len(totals)):
            totals[i] = 0.0
        for _ in range(repeat):
            runner.fn(*inputs)
        out = []
        for step, seconds in zip(self.schedule(), totals):
            out.append({**step, "seconds": seconds / repeat})
        return out

    def layouts(self) -> dict[int, list[tuple[int, ...]]]:
        """The saved plan: the result strides of each extern step (by node position). With the
        optimized graph, ``compile_graph(graph, layouts=...)`` rebuilds this program without
        running externs on zeros (the planner's other decisions are a function of the graph)."""
        return extern_layouts(self.plan)

    def prepacked(self) -> dict[str, Any]:
        """The constant weights this program prepacked for oneDNN, as bytes (views of the
        prepacked tensors, each pack keeping alive what its view reads; keyed as
        :class:`~plait.codegen.onednn.PackedWeights` keys them): what a saved plan carries so
        that a rebuild imports them instead of reordering."""
        return self.plan.packs.export()

    def import_deferred_packs(self) -> None:
        """Import the saved prepacked weights a rebuild deferred (``SavedLayouts(gate=...)``:
        call it once their cache entry is verified, before the first call). A weight that
        cannot be imported is reordered instead, and its node's detail says why."""
        for node, detail in self.plan.packs.import_deferred().items():
            tag = self.plan.tags[node]
            tag = NodeTag(tag.executor, tag.detail.replace(LOADED, detail))
            self.plan.tags[node] = self.evidence.nodes[node] = tag

    def records(self) -> dict[str, Any]:
        """Everything the manifest needs, JSON-serializable."""
        return {
            "backend": "stax",
            "target": self.target,
            "device": str(self.device),
            "cuda_graph": dict(self.cuda_graph),
            "toolchain": self._toolchain(),
            "options": self.options.record(),
            "evidence": self.evidence.records(),
            "schedule": self.schedule(),
            "memory_plan": self.memory_plan.records(),
            **self.timing_records(),
        }

    def _toolchain(self) -> dict[str, Any]:
        if self.target != "cpu":
            return triton_toolchain()
        if self.options.kernels == "tvm":
            from plait.codegen.tvm_build import toolchain_record

            return {**toolchain().record(), "tvm": toolchain_record()}
        return toolchain().record()

    def timing_records(self) -> dict[str, Any]:
        """The part of :meth:`records` that differs between two builds of one program (the
        phase timings, and each kernel's build time and cache hit)."""
        out = {
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
            "kernels": [k.record() for k in self.kernels],
        }
        if self.triton_precompile is not None:
            out["triton_precompile"] = dict(self.triton_precompile)
        return out


def compile_graph(
    graph: Graph,
    *,
    options: StaxOptions | None = None,
    layouts: Mapping[int, Sequence[Sequence[int]]] | None = None,
) -> StaxProgram:
    """Compile ``graph`` (static shapes, CPU tensors) with the Stax backend. ``layouts`` (from
    :meth:`StaxProgram.layouts`) rebuilds a saved plan without its layout dry runs.

    Raises :class:`~plait.codegen.CodegenError` for symbolic shapes, non-CPU tensors, or (with
    ``options.strict``) the first node that would fall back to PyTorch.
    """
    (program,) = compile_graphs([graph], options=options, layouts=[layouts])
    return program


def compile_graphs(
    graphs: Sequence[Graph],
    *,
    options: StaxOptions | None = None,
    layouts: Sequence[Mapping[int, Sequence[Sequence[int]]] | None] | None = None,
    handoff: Mapping[int, int] | None = None,
    resident: Sequence[Mapping[int, Any]] | None = None,
) -> list[StaxProgram]:
    """Compile several graphs, building all their kernels together (fewer, larger compiler
    invocations, all cores busy; identical kernels are built once).

    ``handoff``: for a training step's two graphs (forward, backward), the backward's input
    positions fed by the forward's output positions (its saved values): two CUDA graphs then
    share those buffers (:mod:`plait.runtime.cuda_handoff`). ``resident``: per graph, the
    caller's tensors known at compile time for some input positions (a module's parameters
    and buffers), which a CUDA graph reads where they live (:mod:`plait.runtime.cuda_graph`)."""
    opts = options or StaxOptions()
    start = time.perf_counter()
    plans = []
    targets = [resolve_target(g, opts) for g in graphs]
    for g, saved, target in zip(graphs, layouts or [None] * len(graphs), targets):
        plan = plan_graph(
            g,
            infer_layouts=opts.infer_layouts,
            layouts=saved,
            fuse=opts.fuse,
            channels_last=opts.channels_last,
            mkl_linear=opts.mkl_linear,
            target=target,
            onednn=opts.onednn,
            timed_matmul=opts.timed_matmul,
            gemm_conv=opts.gemm_conv,
            native=tuple(k for k in NATIVE_CONVS if getattr(opts, k)),
            reread=target == "cpu" and opts.kernels != "tvm",  # NOTE: the C++ printer's loops
        )
        if opts.strict and plan.fallbacks:
            nid, reason = next(iter(plan.fallbacks.items()))
            op = next(n.op for n in g.nodes if n.id == nid)
            raise CodegenError(f"would fall back to PyTorch (strict): {reason}", node_id=nid, op=op)
        plans.append(plan)
    t_plan = time.perf_counter()
    popts = PrintOptions(parallel_threshold=opts.parallel_threshold)
    infos: list[list[KernelInfo]] = []
    sources: dict[str, str] = {}
    tvm_rows = _tvm_choices(plans, targets, opts, layouts)
    recorded = [getattr(saved, "printed", {}) for saved in layouts or [None] * len(graphs)]
    for g, plan, target, tvm_row, printed in zip(graphs, plans, targets, tvm_rows, recorded):
        row = []
        tuning = target == "triton" and opts.triton_autotune and bool(plan.kernels)
        kernels = shown(plan.kernels, "tuning Triton kernels" if tuning else None)
        for j, low in enumerate(kernels):
            if target == "triton":
                tune_on = graph_device(g) if opts.triton_autotune else None
                row.append(_triton_info(low, tune_on))
                row[-1].printer = "triton"
                continue
            if tvm_row and tvm_row[j].kernel is not None:
                row.append(_tvm_info(low.kernel, tvm_row[j].kernel, plan))
                continue
            # NOTE: a saved program's text of a kernel of the same structure (printing is a
            # function of the kernel and the options, which its key pins); else printed
            text = printed.get(structure_digest(low.kernel)) if printed else None
            if text is None:
                text = print_kernel(low.kernel, "STAX_SYMBOL", popts)
            digest = hashlib.sha256(text.encode()).hexdigest()
            symbol = f"stax_{digest[:24]}"
            sources[symbol] = text.replace("STAX_SYMBOL", symbol, 1)
            row.append(KernelInfo(low.kernel.name, symbol, low.kernel.template,
                                  low.kernel.nodes, digest, source=sources[symbol]))  # fmt: skip
            if tvm_row:
                row[-1].fallback = tvm_row[j].fallback
                _tag(plan, low.kernel, f"C++: {tvm_row[j].fallback}")
        infos.append(row)
    t_print = time.perf_counter()
    units = _units(sorted(sources), sources, opts)
    if units or any(t == "triton" for t in targets):
        _entries_verified(layouts)
    build_units(units, opts.jobs)
    precompiled = precompile_triton(graphs, plans, infos, targets, opts)
    t_build = time.perf_counter()
    unit_of = {sym: u for u in units for sym in u.symbols}
    programs: list[StaxProgram] = []
    for g, plan, row, target in zip(graphs, plans, infos, targets):
        t0 = time.perf_counter()
        kernel_steps = [i for i, s in enumerate(plan.steps) if isinstance(s, KernelStep)]
        if target == "triton":
            funcs = _load_triton(row, kernel_steps)
        else:
            funcs = _load_cpp(row, kernel_steps, unit_of)
        memory = plan_memory(plan, allow_inplace=opts.inplace, reuse=opts.memory_plan)
        for info, step_index in zip(row, kernel_steps):
            step = plan.steps[step_index]
            assert isinstance(step, KernelStep)
            info.epilogue_of = sorted(
                {bp.epilogue_of for v in step.outputs
                 for bp in [memory.by_value[v]] if bp.epilogue_of is not None}
            )  # fmt: skip
        runner = build_runner(plan, memory, funcs, opts.check_inputs, launch=target == "triton")
        timings = {
            "plan_s": (t_plan - start) / len(graphs),
            "print_s": (t_print - t_plan) / len(graphs),
            "build_s": t_build - t_print,
            "runner_s": time.perf_counter() - t0,
        }
        lender = (programs[0], handoff) if handoff is not None and len(programs) == 1 else None
        program = StaxProgram(
            g, plan, memory, row, runner, opts, timings, funcs, target, borrow_from=lender,
            resident=resident[len(programs)] if resident is not None else None,
            lends=handoff is not None and not programs,
        )  # fmt: skip
        if target == "triton":
            program.triton_precompile = precompiled
        programs.append(program)
    return programs


def _load_cpp(
    row: list[KernelInfo], kernel_steps: list[int], unit_of: Mapping[str, Unit]
) -> dict[int, Any]:
    import ctypes

    funcs: dict[int, Any] = {}
    for step_index, info in zip(kernel_steps, row):
        if info.tvm is not None:
            lib = info.tvm.lib  # NOTE: a TVM kernel: its own library, the same calling convention
            info.unit, info.build_seconds = f"tvm:{info.tvm.key[:16]}", info.tvm.seconds
            info.cache_hit, info.tuning = info.tvm.cache_hit, info.tvm.tuning or None
        else:
            u = unit_of[info.symbol]
            info.unit, info.build_seconds, info.cache_hit = u.key[:16], u.seconds, u.cache_hit
            lib = u.lib
        assert lib is not None
        fn = getattr(lib, info.symbol)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p]
        funcs[step_index] = fn
    return funcs


def _tvm_choices(
    plans: Sequence[Plan], targets: Sequence[str], opts: StaxOptions, layouts: Any
) -> list[list[Any] | None]:
    """For each CPU plan with ``kernels="tvm"``: each kernel's TVM kernel (built) or why the C++
    printer prints it (:mod:`plait.codegen.tvm_kernels`); None for the others. As for C++
    kernels, nothing printed from a cache entry's graph is built before the entry's check."""
    if opts.kernels != "tvm" or "cpu" not in targets:
        return [None] * len(plans)
    from plait.codegen.tvm_kernels import build_choices, choose_tvm

    rows: list[list[Any] | None] = []
    for plan, target in zip(plans, targets):
        kernels = [low.kernel for low in plan.kernels]
        rows.append(
            choose_tvm(kernels, opts.parallel_threshold, opts.tvm_tune) if target == "cpu" else None
        )
    chosen = [c for row in rows for c in row or ()]
    if any(c.kernel is not None for c in chosen):
        _entries_verified(layouts)
    build_choices(chosen, opts.jobs)
    return rows


def _entries_verified(layouts: Any) -> None:
    """Wait until the cache entries the plans were replayed from have passed their hash check:
    kernels printed from an entry's graph reach the compiler (or the kernel cache) only then."""
    for saved in layouts or ():
        if isinstance(saved, SavedLayouts) and saved.gate is not None:
            saved.gate()


def _tvm_info(kernel: Kernel, tvm: Any, plan: Plan) -> KernelInfo:
    digest = hashlib.sha256(tvm.source.source.encode()).hexdigest()
    info = KernelInfo(kernel.name, tvm.symbol, kernel.template, kernel.nodes, digest,
                      source=tvm.source.source, printer="tvm", tvm=tvm)  # fmt: skip
    _tag(plan, kernel, "TVM")
    return info


def _tag(plan: Plan, kernel: Kernel, how: str) -> None:
    """Say in each node's evidence which printer printed the kernel that ran it."""
    import re

    for nid in kernel.nodes:
        tag = plan.tags.get(nid)
        if tag is not None:
            detail = re.sub(rf"\b{re.escape(kernel.name)}\b", f"{kernel.name} [{how}]", tag.detail)
            plan.tags[nid] = NodeTag(tag.executor, detail)


def _named(ts: Any) -> Any:
    """A printed Triton kernel named by the hash of its text (identical kernels: one name)."""
    digest = hashlib.sha256(ts.source.encode()).hexdigest()
    symbol = f"triton_{digest[:24]}"
    return dataclasses.replace(ts, symbol=symbol, source=ts.source.replace("STAX_SYMBOL", symbol))


def _triton_info(low: Any, tune_on: str | None) -> KernelInfo:
    """``low``'s kernel printed for Triton; with ``tune_on`` (a device), its launch shape timed
    there and the fastest kept (:mod:`plait.codegen.triton_tune`)."""
    from plait.codegen.triton import print_triton

    kernel = low.kernel
    blocks, tuning = None, None
    if tune_on is not None:
        from plait.codegen.triton_load import load_triton
        from plait.codegen.triton_tune import tune

        blocks, tuning = tune(kernel, _named, launch_dtypes(low), tune_on, load_triton)
    ts = print_triton(kernel, "STAX_SYMBOL", blocks)
    digest = hashlib.sha256(ts.source.encode()).hexdigest()
    ts = _named(ts)
    info = KernelInfo(kernel.name, ts.symbol, kernel.template, kernel.nodes, digest,
                      source=ts.source)  # fmt: skip
    info.triton, info.tuning = ts, tuning
    return info


def _load_triton(row: list[KernelInfo], kernel_steps: list[int]) -> dict[int, Any]:
    """Each kernel's launcher (Triton compiles a kernel at its first launch, from its own
    on-disk cache when it compiled that source before)."""
    from plait.codegen.triton_load import load_triton

    funcs: dict[int, Any] = {}
    for step_index, info in zip(kernel_steps, row):
        t0 = time.perf_counter()
        funcs[step_index] = load_triton(info.triton)
        info.unit, info.build_seconds = "triton", time.perf_counter() - t0
    return funcs


@functools.lru_cache(maxsize=1)
def triton_toolchain() -> dict[str, Any]:
    """The Triton and CUDA versions a Triton program was built with (the manifest's record)."""
    import importlib.metadata

    import torch

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"triton": triton, "cuda": torch.version.cuda}


def _units(symbols: list[str], sources: dict[str, str], opts: StaxOptions) -> list[Unit]:
    if not symbols:
        return []
    import os

    jobs = opts.jobs or os.cpu_count() or 1
    # NOTE: a program's kernels are split across compiler processes only where each part keeps
    # SPLIT_KERNELS kernels or more: a g++ process costs ~45 ms before its first kernel, a small
    # kernel ~8 ms (native math units on a Xeon), so splitting a program of a few kernels cost
    # CPU time (two processes of mostly start-up) for a few ms of latency at best
    split = max(1, min(jobs, len(symbols) // SPLIT_KERNELS))
    count = max(split, -(-len(symbols) // opts.kernels_per_unit))
    buckets: list[list[str]] = [[] for _ in range(count)]
    for i, sym in enumerate(symbols):
        buckets[i % count].append(sym)
    return [Unit(b, [sources[s] for s in b]) for b in buckets if b]

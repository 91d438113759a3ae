"""From a captured program to something that runs: passes, backend, guards, manifest.

A backend turns a :class:`~plait.frontend.program.CapturedProgram` into a :class:`Compiled`: an
executor with the captured graph's calling convention, the guards the compile added (frozen
parameters), and the specialization's manifest. ``eager`` runs the graph with the reference
interpreter; ``stax`` runs the pass pipeline and the Stax native executor; ``tvm`` is Stax
with its CPU kernels printed and built by Apache TVM (``options={"stax": {"kernels": "tvm"}}``;
``pip install plait[tvm]``).

Example:
    >>> sorted(BACKENDS)
    ['eager', 'stax', 'tvm']
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plait import logs
from plait.autograd import JointGraphError, PartitionError
from plait.autograd.function import without_autocast
from plait.cache import SavedCompile, Store
from plait.cache.lookup import cached_compile, freeze_candidates
from plait.cost import enforce as enforce_budgets
from plait.cost import estimate as estimate_cost
from plait.errors import CaptureFallbackWarning, InvalidOptionError, PlaitCompileError
from plait.frontend.program import CapturedProgram, Continued, Executor
from plait.guards.ambient import (
    ambient_guards,
    call_settings,
    global_hook_guard,
    process_settings,
)
from plait.guards.guard import Guard, GuardEnv
from plait.guards.state import frozen_guards
from plait.ir import Graph, TensorType, Value, interpret
from plait.manifest import Manifest
from plait.passes import INFERENCE_PIPELINE, TRAINING_PIPELINE, run_pipeline

KNOWN_OPTIONS = ("passes", "freeze", "stax", "cuda_graphs", "partitioner", "budgets", "tvm_tune")
_GRAD_FALLBACK = "backend stax → eager interpreter"
_GRAD_REASON = (
    "gradients flow through this call and its backward could not be compiled: the reference "
    "interpreter runs the forward, eager autograd the backward"
)
_TRAINING_NOT_CACHED = (
    "a training program (compiled forward and backward) is not saved in the artifact cache: "
    "each process compiles it"
)


@dataclass
class Compiled:
    executor: Executor | None
    manifest: Manifest
    guards: list[Guard] = field(default_factory=list)
    graph: Graph | None = None  # the graph the executor runs (after passes)
    program: Any = None  # the backend's own program (a StaxProgram), for profiling and explain
    # NOTE: the graph after each pass, in the manifest's pass order (this process's compile;
    # empty when the artifact came from the cache), for the compile report
    pass_graphs: list[Graph] = field(default_factory=list)


@dataclass
class CompileRequest:
    program: CapturedProgram
    backend: str
    fullgraph: bool
    options: dict[str, Any]
    state: Sequence[torch.Tensor]  # the module's parameters and buffers, in slot order
    store: Store | None = None  # the artifact cache (None: compile, never save)
    leaf_grads: tuple[bool, ...] | None = None  # per user input leaf: does it require grad
    name: str = "a plait-compiled program"  # what errors call the compiled callable


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
        if freeze and _on_cuda(req):
            # NOTE: on CUDA a batch norm runs in the Triton epilogue after its convolution (the
            # convolution keeps no bias: cuDNN adds one in a kernel of its own), and in 16-bit
            # floats a folded weight rounds to another function than eager's conv-then-norm
            return ",".join(p for p in INFERENCE_PIPELINE.split(",") if p != "fold-bn")
        return INFERENCE_PIPELINE if freeze else TRAINING_PIPELINE
    return {"inference": INFERENCE_PIPELINE, "training": TRAINING_PIPELINE, "none": ""}.get(
        chosen, chosen
    )


def _state_slots(prog: CapturedProgram) -> dict[str, int]:
    """Graph input name -> index into the module state, for parameter and buffer inputs."""
    out = {}
    for v, slot in zip(prog.interface()[0], prog.inputs):
        if slot.source == "state":
            out[v.name] = slot.ref
    return out


def _bind(inputs: Sequence[Value], optimized: Graph) -> Callable[[list[Any]], list[Any]]:
    """Map the captured graph's input list onto the optimized graph's inputs (by name)."""
    return _bind_names([v.name for v in inputs], optimized)


def _bind_names(names: Sequence[str], optimized: Graph) -> Callable[[list[Any]], list[Any]]:
    """Like :func:`_bind`, from the captured graph's input names; raises KeyError when the
    optimized graph reads an input ``names`` lacks."""
    index = {name: i for i, name in enumerate(names)}
    plan: list[tuple[bool, Any]] = []
    for v in optimized.inputs:
        if v.name in optimized.constants:
            plan.append((False, optimized.constants[v.name]))
        else:
            plan.append((True, index[v.name]))
    return lambda values: [values[ref] if live else ref for live, ref in plan]


def _eager_executor(inputs: Sequence[Value], optimized: Graph) -> Executor:
    bind = _bind(inputs, optimized)
    # NOTE: the interpreter returns a constant (or a view of one) as it is: the caller gets a
    # copy instead, or a write to a result would change what later calls compute
    owned = {
        t.untyped_storage().data_ptr()
        for t in optimized.constants.values()
        if isinstance(t, torch.Tensor)
    }

    def run(values: list[Any]) -> list[Any]:
        # NOTE: capture wrote autocast's casts into the graph
        out = without_autocast(interpret, optimized, bind(values), False)
        if not owned:
            return out
        return [
            t.clone()
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in owned
            else t
            for t in out
        ]

    return run


def run_captured(
    prog: CapturedProgram | Continued,
    env: GuardEnv,
    state: Sequence[torch.Tensor],
    containers: Sequence[Any],
    name: str,
) -> Any:
    """The call whose capture was refused after its Python ran to its end
    (:mod:`plait.frontend.refused_after_run`): its result from its captured graph as it is (no
    passes), run by the reference interpreter, inputs and buffers written back once; gradients
    flow through its PyTorch calls, as through the ``eager`` backend's. A call that went on
    eagerly from a refusal (:mod:`plait.frontend.continuation`) returns its result."""
    if isinstance(prog, Continued):
        logs.emit("capture", "ran_once", f"{name}: the call that captured went on eagerly")
        return prog.output
    assert prog.graph is not None
    logs.emit("capture", "ran_once", f"{name}: the call that captured runs its captured graph")
    return prog.run(_eager_executor(prog.graph.inputs, prog.graph), env, state, containers)


def _stax_options(req: CompileRequest, training: bool = False) -> Any:
    from plait.runtime import StaxOptions

    settings = dict(req.options.get("stax") or {})
    settings.setdefault("strict", req.fullgraph)
    if training:
        # NOTE: the backward's convolution kernels read the forward's saved activations: in
        # PyTorch's layout they run as eager's do (channels_last ones took 1.6x as long on
        # ResNet-18, 8x112x112, 2 threads: mkldnn's backward over mixed layouts)
        settings.setdefault("channels_last", False)
        # NOTE: weights change every step: oneDNN's prepack per call cost more than it saved
        # (ResNet-18 forward, 8x112x112: 86 ms against eager's 47)
        settings.setdefault("onednn", False)
    if "cuda_graphs" in req.options:
        settings.setdefault("cuda_graphs", bool(req.options["cuda_graphs"]))
    if "tvm_tune" in req.options:
        settings.setdefault("tvm_tune", req.options["tvm_tune"])
    return StaxOptions(**settings)


def _tvm_request(req: CompileRequest) -> CompileRequest:
    """``backend="tvm"``: the Stax backend with TVM kernels (refused with how to install TVM
    where it is not installed)."""
    from plait.codegen.tvm_build import require_tvm

    require_tvm()
    stax = {**dict(req.options.get("stax") or {}), "kernels": "tvm"}
    return dataclasses.replace(req, backend="stax", options={**req.options, "stax": stax})


def _stax_program(req: CompileRequest, optimized: Graph) -> Any:
    from plait.runtime import CodegenError, compile_graph

    try:
        return compile_graph(optimized, options=_stax_options(req))
    except CodegenError as exc:
        raise PlaitCompileError(f"stax could not compile the graph: {exc}") from exc


def _stax_timings(m: Manifest, records: dict[str, Any]) -> None:
    m.timings.update({f"stax.{k}": v for k, v in records.pop("timings", {}).items()})
    # NOTE: Triton kernels compiled ahead of their first launch: how many, how many at once
    pre = records.pop("triton_precompile", None)
    if pre is not None:
        from plait.codegen.triton_pool import LARGEST, SUMMED

        for key in ("kernels", "jobs", "seconds", *SUMMED, *LARGEST):
            if key in pre:
                m.timings[f"stax.triton_precompile.{key}"] = pre[key]
        if "error" in pre:
            m.fallbacks.append({"what": "Triton precompile", "reason": pre["error"]})
        for why in pre.get("worker_errors", []):
            m.fallbacks.append({"what": "Triton compile worker (compiled here)", "reason": why})
    for k in records.get("kernels", []):
        name = k.get("name", "?")
        for key in ("build_seconds", "cache_hit"):
            if key in k:
                m.timings[f"stax.kernel.{name}.{key}"] = k.pop(key)


def _stax_records(program: Any, m: Manifest) -> None:
    _stax_records_from(program.records(), m)


def _stax_records_from(records: dict[str, Any], m: Manifest) -> None:
    _stax_timings(m, records)
    m.kernels = {"kernels": records.pop("kernels", []), "schedule": records.pop("schedule", [])}
    kind = "cxx" if records.get("target", "cpu") == "cpu" else "triton"
    m.toolchain[kind] = records.pop("toolchain", {})
    if "tvm" in m.toolchain[kind]:  # NOTE: TVM kernels: TVM's version, target, printer
        m.toolchain["tvm"] = m.toolchain[kind].pop("tvm")
    m.executor = records
    for n in records.get("evidence", {}).get("nodes", []):
        if n["executor"] == "fallback":
            m.fallbacks.append({"what": f"node {n['id']} ({n['op']})", "reason": n["detail"]})
    _printer_fallbacks(m.kernels["kernels"], m, "")
    _log_codegen(m.executor, m.kernels.get("kernels", []))


def _printer_fallbacks(kernels: list[dict[str, Any]], m: Manifest, where: str) -> None:
    """Kernels the printer asked for (TVM) did not print: the C++ printer did, and why."""
    for k in kernels:
        if k.get("fallback"):
            what = f"{where}kernel {k.get('name', '?')} (TVM → C++ printer)"
            m.fallbacks.append({"what": what, "reason": k["fallback"]})


def _log_codegen(executor: dict[str, Any], kernels: list[dict[str, Any]], half: str = "") -> None:
    """The ``codegen`` channel: what ran where, each fallback node with its reason."""
    counts = executor.get("evidence", {}).get("counts", {})
    what = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if v)
    logs.emit(
        "codegen",
        "program",
        f"stax {executor.get('target', '?')}{half}: {len(kernels)} kernels; nodes: {what}",
        target=executor.get("target"),
        kernels=len(kernels),
        counts=dict(counts),
    )
    for n in executor.get("evidence", {}).get("nodes", []):
        if n["executor"] == "fallback":
            logs.emit(
                "codegen",
                "fallback",
                f"node {n['id']} ({n['op']}){half} runs in PyTorch: {n['detail']}",
                node=n["id"],
                op=n["op"],
                reason=n["detail"],
            )


def _grad_inputs(req: CompileRequest, optimized: Graph) -> list[str]:
    """The optimized graph's inputs a gradient is asked for: tensors that require grad."""
    prog = req.program
    by_name = {}
    for v, slot in zip(prog.interface()[0], prog.inputs):
        if slot.source == "state":
            t = req.state[slot.ref]
        elif slot.source == "const":
            t = slot.ref
        else:
            t = None
            wants = req.leaf_grads
            if wants is not None and slot.ref < len(wants):
                by_name[v.name] = wants[slot.ref]
            continue
        by_name[v.name] = isinstance(t, torch.Tensor) and t.requires_grad
    return [v.name for v in optimized.inputs if by_name.get(v.name, False)]


def _training_program(req: CompileRequest, optimized: Graph) -> Any:
    from plait.runtime import CodegenError
    from plait.runtime.training import compile_training

    written = {o for _, o in req.program.mutations}
    outputs = [i for i in range(len(optimized.outputs)) if i not in written]
    try:
        return compile_training(
            optimized,
            _grad_inputs(req, optimized),
            differentiable_outputs=outputs,
            partitioner=str(req.options.get("partitioner", "min-cut")),
            options=_stax_options(req, training=True),
            source_hash=req.program.semantic_hash,
            name=req.name,
            resident=_resident_state(req, optimized),
        )
    except CodegenError as exc:
        raise PlaitCompileError(f"stax could not compile the training graphs: {exc}") from exc


def _resident_state(req: CompileRequest, optimized: Graph) -> dict[str, torch.Tensor]:
    """The module's CUDA parameters and buffers by the input name ``optimized`` gives them:
    the tensors every call passes (an optimizer updates them in place), which the training
    graphs then read where they live (runtime.cuda_graph)."""
    names = {v.name for v in optimized.inputs}
    out: dict[str, torch.Tensor] = {}
    for v, slot in zip(req.program.interface()[0], req.program.inputs):
        if slot.source == "state" and v.name in names:
            t = req.state[slot.ref]
            if isinstance(t, torch.Tensor) and t.is_cuda:
                out[v.name] = t
    return out


def _training_records(training: Any, m: Manifest) -> None:
    records = training.records()
    fwd, bwd = records.pop("forward"), records.pop("backward")
    m.timings.update({f"training.{k}": v for k, v in records.pop("timings").items()})
    _stax_records_from(fwd, m)
    kernels = {"kernels": m.kernels.get("kernels", []), "schedule": m.kernels.get("schedule", [])}
    _stax_timings(m, bwd)
    m.kernels = {
        **kernels,
        "backward_kernels": bwd.pop("kernels", []),
        "backward_schedule": bwd.pop("schedule", []),
    }
    bwd.pop("toolchain", None)
    m.executor["backward"] = bwd
    _printer_fallbacks(m.kernels["backward_kernels"], m, "backward ")
    _log_codegen(bwd, m.kernels["backward_kernels"], " backward")
    for n in bwd.get("evidence", {}).get("nodes", []):
        if n["executor"] == "fallback":
            m.fallbacks.append(
                {"what": f"backward node {n['id']} ({n['op']})", "reason": n["detail"]}
            )
    m.autograd = records


def _stax_executor(inputs: Sequence[Value], optimized: Graph, program: Any) -> Executor:
    return stax_executor([v.name for v in inputs], optimized, program)


def stax_executor(names: Sequence[str], optimized: Graph, program: Any) -> Executor:
    """The executor of a Stax ``program`` built for ``optimized``, fed the captured graph's
    inputs in ``names``' order; raises KeyError when ``optimized`` reads an input not named."""
    bind = _bind_names(names, optimized)

    def run(values: list[Any]) -> list[Any]:
        # NOTE: capture wrote autocast's casts into the graph
        return without_autocast(program, *bind(values))

    return run


def compile_program(req: CompileRequest) -> Compiled:
    """Run the pass pipeline and the backend for one specialization, or load it from the
    artifact cache (``req.store``) when an entry with the same key is there; build its
    manifest either way."""
    prog = req.program
    unknown = sorted(set(req.options) - set(KNOWN_OPTIONS))
    if unknown:
        raise InvalidOptionError(f"unknown compile options {unknown}; known: {list(KNOWN_OPTIONS)}")
    m = Manifest(source_hash=prog.semantic_hash or "", options=_options_record(req))
    if req.backend == "tvm":
        req = _tvm_request(req)
    m.guards = prog.guards.texts()
    m.fallbacks = [
        {
            "what": f"opaque {k} ×{v}",
            "reason": f"PyTorch runs the call: {prog.opaque_reasons.get(k, 'no IR op')}",
        }
        for k, v in sorted(prog.opaque_counts.items())
    ]
    if not prog.has_graph:
        m.fallbacks.append({"what": "whole program", "reason": prog.fallback_reason or "?"})
        return Compiled(None, m)
    needs_grad = _needs_grad(req)
    freeze = req.options.get("freeze")
    freeze = (not needs_grad) if freeze is None else bool(freeze)
    if freeze and needs_grad:
        raise InvalidOptionError(
            "freeze=True needs a call no gradient flows through (torch.no_grad(), "
            "or parameters and inputs that do not require grad)"
        )
    pipeline = _pipeline(req, freeze)
    # NOTE: the global module hooks a capture ran are part of the program, like the settings
    ambient = [*ambient_guards(), global_hook_guard()]
    with outside_inference_mode():
        if req.store is None or (needs_grad and req.backend == "stax"):
            compiled = _compile(req, m, pipeline, freeze, needs_grad)
            if req.store is not None:
                events = [_TRAINING_NOT_CACHED]
                compiled.manifest.cache = {"status": "not cached", "events": events}
        else:
            settings = {**call_settings(), **process_settings(_on_cuda(req))}
            compiled = cached_compile(
                req, m, pipeline, freeze, needs_grad, _compile, _restore, settings
            )
    compiled.guards += ambient
    compiled.manifest.guards += [g.text for g in ambient if not g.batch]
    enforce_budgets(req.options.get("budgets"), compiled.manifest, req.name)
    return compiled


@contextlib.contextmanager
def outside_inference_mode() -> Iterator[None]:
    """The block out of the caller's ``torch.inference_mode()``, grad mode as the call has it:
    a compile's folded constants and a warm start's constants loaded from the entry are then
    plain tensors (inference tensors have no version counter, and the checks of a prepacked
    weight read one: under inference mode a conv-batch-norm fold, or any warm start with a
    prepacked linear, raised)."""
    if not torch.is_inference_mode_enabled():
        yield
        return
    grad = torch.is_grad_enabled()
    with torch.inference_mode(False), torch.set_grad_enabled(grad):
        yield


def _on_cuda(req: CompileRequest) -> bool:
    types = [v.type for v in req.program.interface()[0]]
    devices = {t.device for t in types if isinstance(t, TensorType)}
    devices |= {str(t.device) for t in req.state if isinstance(t, torch.Tensor)}
    return any(d.startswith("cuda") for d in devices)


def _autocast_off(build: Callable[..., Compiled]) -> Callable[..., Compiled]:
    """``build`` run with autocast off: capture wrote autocast's casts into the graph, and a
    compile that runs the program (an extern's dry run, a CUDA graph's capture, the Triton
    kernels' first launches) inside the user's ``torch.autocast`` would cast again (CUDA's
    autocast runs ``sum`` in float32: a bfloat16 program then reads a float32 buffer)."""

    def run(*args: Any) -> Compiled:
        return without_autocast(build, *args)

    run.__doc__ = build.__doc__
    return run


@_autocast_off
def _compile(
    req: CompileRequest, m: Manifest, pipeline: str, freeze: bool, needs_grad: bool
) -> Compiled:
    """The cold path: passes, then the backend."""
    prog = req.program
    graph = prog.graph
    assert graph is not None
    state = list(req.state)
    slots = _state_slots(prog)
    # NOTE: the cache key names the same candidates (one definition): never a parameter or
    # buffer the program writes (it changes every call; frozen, its guard would fail the next)
    candidates = freeze_candidates(graph.inputs, prog.written_inputs(), slots, pipeline)
    params = {n: state[slots[n]] for n in candidates} if freeze else {}
    if req.backend == "stax":
        from plait.runtime.kernel_targets import begin_compile

        begin_compile(graph, _stax_options(req, training=needs_grad))
    start = time.perf_counter()
    result = run_pipeline(graph, pipeline, params=params, source_hash=prog.semantic_hash)
    m.timings["passes"] = time.perf_counter() - start
    m.passes = result.to_json()
    m.timings.update({f"pass.{k}": v for k, v in result.timings().items()})
    optimized = result.graph
    kept = [r.graph for r in result.records if r.graph is not None]
    frozen = [
        n for rec in result.records if rec.name == "freeze" for n in rec.details.get("frozen", [])
    ]
    guards = frozen_guards({n: slots[n] for n in frozen}, state, list(slots.values()))
    m.guards += [g.text for g in guards if not g.batch]
    m.graph = {
        "nodes_captured": len(graph.nodes),
        "nodes_optimized": len(optimized.nodes),
        "frozen": frozen,
        "aten_externs": aten_extern_counts(optimized),
        "data_dependent_sizes": data_dependent_sizes(optimized),
        "cost": estimate_cost(optimized).records(),
    }
    if req.backend == "stax" and needs_grad:
        start = time.perf_counter()
        try:
            training = _training_program(req, optimized)
        except (JointGraphError, PartitionError) as exc:
            if req.fullgraph:
                raise PlaitCompileError(f"plait could not compile the backward: {exc}") from exc
            reason = f"{_GRAD_REASON}: {exc}"
            warnings.warn(f"plait stax: {reason}", CaptureFallbackWarning, stacklevel=7)
            m.fallbacks.append({"what": _GRAD_FALLBACK, "reason": reason})
            m.executor = {"backend": "eager", "requested": "stax"}
            executor = _eager_executor(graph.inputs, optimized)
            return Compiled(executor, m, guards, optimized, pass_graphs=kept)
        _training_records(training, m)
        m.timings["backend"] = time.perf_counter() - start
        bind = _bind(graph.inputs, optimized)
        run = lambda values: training(bind(values))
        return Compiled(run, m, guards, optimized, training, kept)
    if req.backend == "stax":
        start = time.perf_counter()
        program = _stax_program(req, optimized)
        _stax_records(program, m)
        m.timings["backend"] = time.perf_counter() - start
        executor = _stax_executor(graph.inputs, optimized, program)
        return Compiled(executor, m, guards, optimized, program, kept)
    m.executor = {"backend": "eager", "evidence": {"counts": {"interpreted": len(optimized.nodes)}}}
    executor = _eager_executor(graph.inputs, optimized)
    return Compiled(executor, m, guards, optimized, pass_graphs=kept)


def aten_extern_counts(graph: Graph) -> dict[str, int]:
    """How many typed ATen extern nodes the graph runs, by overload (``aten.<name>``; the
    data-dependent ones too): PyTorch's kernels by design, counted apart from the fallbacks
    (opaque nodes stay fallbacks)."""
    counts: dict[str, int] = {}
    for n in graph.nodes:
        if n.op in ("aten", "aten_factory", "aten_datadep"):
            key = _overload_key(n)
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def data_dependent_sizes(graph: Graph) -> dict[str, str]:
    """Each unbacked size of the graph (``dd0``: known only when its node has run, never
    guarded) and the node that makes it, e.g. ``{"dd0": "aten.nonzero (node 3)"}``."""
    out: dict[str, str] = {}
    for n in graph.nodes:
        if n.op == "aten_datadep":
            for name in n.attrs["sizes"].split(","):
                out[name] = f"{_overload_key(n)} (node {n.id})"
    return out


def _overload_key(n: Any) -> str:
    overload = n.attrs["overload"]
    return f"aten.{n.attrs['name']}" + ("" if overload == "default" else f".{overload}")


@_autocast_off
def _restore(req: CompileRequest, saved: SavedCompile) -> Compiled:
    """The warm path: a loaded entry as a Compiled (no pass, no dry run, no compiler)."""
    prog = req.program
    inputs = prog.interface()[0]  # NOTE: not prog.graph: a snapshot's nodes stay unparsed
    m = Manifest.from_json(saved.manifest)
    m.timings = dict(saved.seconds)
    if any(f.get("what") == _GRAD_FALLBACK for f in m.fallbacks):
        # NOTE: never silent, warm or cold
        warnings.warn(f"plait stax: {_GRAD_REASON}", CaptureFallbackWarning, stacklevel=8)
    slots = _state_slots(prog)
    used = list(slots.values())
    guards = frozen_guards({n: slots[n] for n in saved.frozen}, list(req.state), used)
    if saved.program is not None:
        # NOTE: the rest of the program's records is in the saved manifest already
        _stax_timings(m, saved.program.timing_records())
        executor = _stax_executor(inputs, saved.graph, saved.program)
    else:
        executor = _eager_executor(inputs, saved.graph)
    return Compiled(executor, m, guards, saved.graph, saved.program)


def _options_record(req: CompileRequest) -> dict[str, Any]:
    return {
        "backend": req.backend,
        "fullgraph": req.fullgraph,
        "dynamic": req.program.dynamic,
        **{k: v for k, v in sorted(req.options.items())},
    }


BACKENDS = ("eager", "stax", "tvm")

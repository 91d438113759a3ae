"""``plait.export``: a program compiled by ``plait.compile``'s own pipeline, made into an
:class:`Artifact`.

The export compiles the callable as ``plait.compile`` does (the same capture, passes, backend
and manifest: one pipeline, never a second), under ``torch.no_grad()`` (an exported program is
an inference program: parameters are frozen into it), and takes from the specialization its
captured graph, its optimized graph, the weights the optimized graph reads, its guard plan and
its manifest. It then draws reference cases (fresh inputs, never the example), runs eager
PyTorch, its float64 copy and the compiled program on them, assembles the members, loads the
artifact it made in this process and judges it through the conformance gate against the
references under the contract it stores: an artifact whose program fails the gate, or does not
reproduce the compiled program's outputs bit for bit, is never returned.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

import plait
import plait.contract
from plait.codegen import timed_choices
from plait.conformance import ConformanceError, Report
from plait.conformance.gate import MIN_SAMPLES
from plait.errors import ExportError, ExportWarning, InvalidOptionError
from plait.export import native as native_kernels
from plait.export import references as refs
from plait.export.archive import Limits, Members, build_index, index_bytes, write_archive
from plait.export.archive import digest as digest_of
from plait.export.calling import (
    Binder,
    call_spec_to_json,
    count_leaves,
    encode_value,
    leaves_to_json,
    signature_to_json,
    spec_to_json,
)
from plait.export.guards import guard_records, guards_from_plan, portable_plan
from plait.export.loaded import LoadedProgram
from plait.export.loading import load_members, parse_program
from plait.export.tensors import write_tensors
from plait.frontend import pytree
from plait.frontend.inputs import InputAdapter
from plait.frontend.state import ModuleState
from plait.ir import Graph, TensorType, get_op, to_text, weights_hash
from plait.specialization import SpecializationMissError


@dataclass
class Artifact:
    """An exported program, in memory: its members (name -> bytes) and its index. ``save``
    writes the archive; ``digest`` names it (what ``plait.load(..., trust=)`` takes);
    ``verdict`` is the conformance gate's report on it at export; ``seconds`` what each step
    of the export took."""

    members: dict[str, bytes]
    header: dict[str, Any]
    verdict: Report
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def index(self) -> dict[str, Any]:
        return build_index(self.header, self.members)

    @property
    def digest(self) -> str:
        return digest_of(index_bytes(self.index))

    @property
    def semantic_hash(self) -> str:
        return str(self.header["semantic_hash"])

    @property
    def native(self) -> bool:
        """Whether it carries native kernel libraries."""
        return "native/index.json" in self.members

    def save(self, path: str | Path) -> Path:
        """Write the artifact to ``path`` (atomically); returns the path."""
        write_archive(path, self.members, self.header)
        return Path(path)

    def load(self, *, trust: Any = None) -> LoadedProgram:
        """The artifact loaded in this process, as :func:`plait.load` loads its file."""
        members = Members(self.index, self.digest, dict(self.members))
        trusted = native_kernels.trusted_digests(trust)
        return load_members(members, self.header["name"], trusted, Limits())


def _refuse_repeated_tensors(model_or_fn: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """An example passing one tensor as two inputs, or a parameter or buffer of the model as an
    input, is refused: capture traces it as one tensor (``a is b``, ``x is self.weight`` hold as
    in eager), where an artifact takes each input apart from the others and from its weights."""
    _, leaves, paths = InputAdapter(model_or_fn).flatten(args, kwargs)
    first: dict[int, str] = {}
    if isinstance(model_or_fn, torch.nn.Module):
        named = [*model_or_fn.named_parameters(), *model_or_fn.named_buffers()]
        first.update((id(t), f"the model's {name}") for name, t in named)
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, torch.Tensor) and first.setdefault(id(leaf), path) != path:
            raise ExportError(
                f"the example passes one tensor as {first[id(leaf)]} and as {path}: an exported "
                "program takes each input apart, so export with distinct tensors (for example "
                f"{path}=x.clone())"
            )


def export(
    model_or_fn: Any,
    args: Any,
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic: bool | None = None,
    native: bool = True,
    references: int = 2,
) -> Artifact:
    """See :func:`plait.export.export` (the public entry point)."""
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    if references < 1:
        raise InvalidOptionError("references must be >= 1: verify judges the program on them")
    _refuse_repeated_tensors(model_or_fn, args, kwargs)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    # NOTE: the libraries timing chose, carried: a load on this machine replays them
    with timed_choices.recording() as timed:
        compiled, key, spec = _compile(model_or_fn, args, kwargs, dynamic)
    seconds["compile"] = time.perf_counter() - start
    prog, comp = spec.program, spec.compiled
    _check_exportable(prog, comp)
    if dynamic and prog.specialized and not _symbolic_inputs(prog):
        # NOTE: an artifact cannot recompile: a program capture made wholly static takes only
        # the example's sizes
        warnings.warn(
            "plait.export(dynamic=True): capture made every input size static, so the artifact "
            f"refuses calls of other sizes: {'; '.join(prog.specialized)} (a size equal to one "
            "of the model's own sizes is made static with it: export with an example whose "
            "dynamic sizes differ from the model's)",
            ExportWarning,
            stacklevel=3,
        )
    stax = comp.program is not None and comp.manifest.executor.get("backend") == "stax"
    note = "" if stax else str(comp.manifest.options.get("backend_choice", "not Stax"))
    if not stax:
        warnings.warn(
            f"plait.export: the exported program runs on plait's reference interpreter, not "
            f"native kernels: {note}",
            ExportWarning,
            stacklevel=3,
        )
    adapter = InputAdapter(model_or_fn)
    call_spec, leaves, paths = adapter.flatten(args, kwargs)
    # NOTE: arguments an export cannot take (an object of the model's own type) refused first
    call_json, leaves_json = call_spec_to_json(call_spec), leaves_to_json(leaves, paths)
    state = ModuleState(model_or_fn).fetch() if isinstance(model_or_fn, nn.Module) else []
    binding, weights, constant = _inputs(prog, comp.graph, state)
    out_leaves = _outputs(prog)
    name = adapter.name
    binder = Binder.from_json(signature_to_json(adapter.signature, adapter.defaults), name)

    start = time.perf_counter()
    cases, out_doc, layouts, anchor = _reference_cases(
        model_or_fn, compiled, key, references, binder, (call_spec, leaves)
    )
    enough = _cases_for_samples([*cases.outputs["eager"][0], *cases.inputs[0]], references)
    if enough > references:  # NOTE: the same seeds: the first cases are drawn again as they were
        cases, out_doc, layouts, anchor = _reference_cases(
            model_or_fn, compiled, key, enough, binder, (call_spec, leaves)
        )
    seconds["references"] = time.perf_counter() - start
    case_paths = binder.flatten(*cases.call(0))[2]
    carried = guards_from_plan(
        portable_plan(prog.guard_plan), call_spec, cases.inputs[0], case_paths
    )

    calling = {
        "signature": signature_to_json(adapter.signature, adapter.defaults),
        "call": call_json,
        "leaves": leaves_json,
        "inputs": [
            {"name": v.name, "leaf": leaf, "constant": v.name in constant}
            for v, leaf in zip(comp.graph.inputs, binding)
        ],
        "outputs": {"spec": spec_to_json(prog.out_spec, "the result"), "leaves": out_leaves},
    }
    guards = {
        "plan": portable_plan(prog.guard_plan),
        "carried": [g.text for g in carried if not g.batch],
        "all": guard_records(list(spec.guards)),
    }
    ref_bytes, ref_doc = refs.pack(cases, out_doc, layouts)
    ref_doc["anchor"] = anchor
    members = {
        "program.ir": to_text(comp.graph).encode(),
        "captured.ir": to_text(prog.graph).encode(),
        "weights.safetensors": write_tensors(weights),
        "calling.json": _json(calling),
        "guards.json": _json(guards),
        # NOTE: the manifest without its timings and cache events: one export, one set of bytes
        "manifest.json": _json(comp.manifest.deterministic()),
        "contract.toml": plait.contract.default_text().encode(),
        "reference.safetensors": ref_bytes,
    }
    why_native = "not asked for (native=False)"
    if native and stax:
        libs, native_index, why_native = native_kernels.collect(comp.program)
        if native_index is not None:
            members.update(libs)
            members["native/index.json"] = _json(native_index)
    header = {
        "name": name,
        "semantic_hash": prog.semantic_hash,
        "weights_hash": weights_hash(weights),
        "executor": "stax" if stax else "interpreter",
        "executor_note": note,
        "device": _device(comp.graph),
        "stax_options": comp.program.options.record() if stax else {},
        "timed_choices": dict(sorted(timed.items())),
        "native_note": why_native,
        "plait_version": plait.__version__,
        "torch_version": torch.__version__,
    }
    start = time.perf_counter()
    members["reference.json"] = _json({**ref_doc, "verdict": {}})
    artifact = Artifact(members, header, Report())
    verdict = _judge(artifact, cases)
    members["reference.json"] = _json({**ref_doc, "verdict": _verdict_record(verdict)})
    artifact.verdict = verdict
    seconds["judge"] = time.perf_counter() - start
    artifact.seconds = seconds
    return artifact


def _compile(fn: Any, args: tuple, kwargs: dict, dynamic: bool | None) -> tuple[Any, str, Any]:
    """``plait.compile``'s pipeline on this call, with gradients off: the compiled callable,
    the key of the specialization the call makes, and that specialization."""
    options = {"cache": False, "stax": {"strict": False}}
    compiled = plait.compile(fn, fullgraph=True, dynamic=dynamic, options=options)
    with torch.no_grad():
        use = compiled.specialize(*args, **kwargs)
    return compiled, use.key, compiled.specializations[use.index]


def _symbolic_inputs(prog: Any) -> bool:
    """Whether any user input of the captured program has a symbolic size."""
    return any(
        slot.source == "user"
        and isinstance(v.type, TensorType)
        and any(not isinstance(n, int) for n in v.type.shape)
        for v, slot in zip(prog.graph.inputs, prog.inputs)
    )


def _check_exportable(prog: Any, comp: Any) -> None:
    """Refuse what an artifact cannot hold (see :func:`plait.export.export`)."""
    if prog.graph is None or comp.graph is None or comp.executor is None:
        raise ExportError(f"the program was not compiled: {prog.fallback_reason or 'no graph'}")
    if prog.mutations:
        raise ExportError(
            "the program writes its inputs, parameters or buffers in place: an exported program "
            "is a function of its inputs (call model.eval(); write no argument in place)"
        )
    if getattr(prog, "containers", False):
        raise ExportError(
            "the program changes or returns an input object (a key/value cache): an exported "
            "program is a function of its tensors"
        )
    if getattr(prog, "attr_writes", None):
        raise ExportError(
            "the program sets Python attributes of tensors (x.flag = ...): an exported program "
            "is a function of its tensors"
        )
    if prog.guard_plan is None:
        raise ExportError("the program's guards have no saved form (a region of a module?)")
    for node in comp.graph.nodes:
        if get_op(node.op).is_random(node.attrs):
            raise ExportError(
                f"the program draws random numbers (node {node.id}: {node.op}): an exported "
                "program is a function of its inputs (call model.eval() to turn dropout off)"
            )
    parse_program("the optimized program", to_text(comp.graph), Limits())


def _json(doc: Any) -> bytes:
    import json

    return (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode()


def _device(graph: Graph) -> str:
    devices = {v.type.device for v in graph.inputs if isinstance(v.type, TensorType)}
    if len(devices) > 1:
        raise ExportError(f"the program's inputs span devices {sorted(devices)}")
    return devices.pop() if devices else "cpu"


def _inputs(
    prog: Any, optimized: Graph, state: Sequence[torch.Tensor]
) -> tuple[list[int | None], dict[str, torch.Tensor], set[str]]:
    """Where each optimized-graph input comes from (a user leaf, or a weight) and the weights,
    by input name; which of them the compile held as constants."""
    assert prog.graph is not None
    slots = {v.name: slot for v, slot in zip(prog.graph.inputs, prog.inputs)}
    binding: list[int | None] = []
    weights: dict[str, torch.Tensor] = {}
    constant: set[str] = set()
    for v in optimized.inputs:
        if v.name in optimized.constants:
            value = optimized.constants[v.name]
            constant.add(v.name)
        else:
            slot = slots.get(v.name)
            if slot is None:
                raise ExportError(f"program input %{v.name} has no source (internal)")
            if slot.source == "user":
                binding.append(slot.ref)
                continue
            # NOTE: module state the compile did not freeze (the interpreter's programs): read
            # only (a written one was refused), carried as a weight bound at each call
            value = state[slot.ref] if slot.source == "state" else slot.ref
        if not isinstance(value, torch.Tensor):
            raise ExportError(f"program input %{v.name} is a {type(value).__name__}, not a tensor")
        binding.append(None)
        weights[v.name] = value.detach()
    return binding, weights, constant


def _outputs(prog: Any) -> list[dict[str, Any]]:
    """The output leaves as ``calling.json`` records them (inputs by user leaf)."""
    user = {i: slot.ref for i, slot in enumerate(prog.inputs) if slot.source == "user"}
    tracers: dict[int, int] = {}
    out = []
    for leaf in prog.out_leaves:
        if leaf.source == "value":
            out.append({"from": "value", "value": encode_value(leaf.ref, "a result")})
        elif leaf.source == "graph":
            index, tracer, fresh = leaf.ref
            # NOTE: which leaves are one tensor, numbered in order (not the tracers' ids)
            same = tracers.setdefault(tracer, len(tracers))
            layout = prog.out_layouts[index] if index < len(prog.out_layouts) else None
            out.append({"from": "output", "index": index, "tracer": same, "fresh": bool(fresh),
                        "layout": layout})  # fmt: skip
        elif leaf.source == "view":  # NOTE: a view of another output (frontend.output_views)
            index, tracer, size, stride, offset, _, base_size, base_stride, *reread = leaf.ref
            same = tracers.setdefault(tracer, len(tracers))
            out.append({"from": "view", "index": index, "tracer": same, "size": list(size),
                        "stride": list(stride), "offset": offset, "base_size": list(base_size),
                        "base_stride": list(base_stride),
                        "dtype": str(reread[0]) if reread else None})  # fmt: skip
        else:
            slot = leaf.ref if leaf.source == "input" else leaf.ref[0]
            if slot not in user:
                raise ExportError("the program returns a parameter or buffer itself")
            if leaf.source == "input":
                out.append({"from": "leaf", "leaf": user[slot]})
                continue
            _, size, stride, offset, _, *reread = leaf.ref
            dtype = encode_value(getattr(torch, str(reread[0])), "dtype") if reread else None
            out.append({"from": "alias", "leaf": user[slot], "size": list(size),
                        "stride": list(stride), "offset": offset, "dtype": dtype})  # fmt: skip
    return out


def _reference_cases(
    fn: Any,
    compiled: Any,
    key: str,
    count: int,
    binder: Binder,
    example: tuple[Any, Sequence[Any]],
) -> tuple[refs.ReferenceCases, list[dict[str, Any]], list[str | None], str]:
    """The reference cases (inputs laid out as the example's), the output leaves' record,
    the inputs' layouts and what anchors the float64 outputs (or why nothing does).

    Cases are drawn from the example's bound call, defaults applied: a default the artifact
    cannot record (a tuple, a tensor) is passed by each case, as a loaded call must pass it."""
    call_spec, example_leaves = example
    args, kwargs = _rebuilt(binder, call_spec, list(example_leaves))
    layouts = [
        refs.memory_format(x) if isinstance(x, torch.Tensor) else None for x in example_leaves
    ]
    wide, anchor = refs.float64_copy(fn)
    inputs: list[list[Any]] = []
    outputs: dict[str, list[list[Any]]] = {"eager": [], "float64": [], "compiled": []}
    out_doc: list[dict[str, Any]] = []
    out_spec: Any = None
    for drawn_args, drawn_kwargs in refs.draw_cases(args, kwargs, count):
        spec, leaves, _ = binder.flatten(drawn_args, drawn_kwargs)
        if spec != call_spec:
            raise ExportError("the drawn reference call has another structure (internal)")
        leaves = refs.laid_out(leaves, layouts)
        a, kw = _rebuilt(binder, call_spec, leaves)
        with torch.no_grad():
            eager = fn(*a, **kw)
            try:
                result = compiled.call_specialization(key, *a, **kw)
            except SpecializationMissError as exc:
                # NOTE: a case is laid out contiguous or channels-last: an example of other
                # strides whose layout the program reads has no case its guards admit
                raise ExportError(
                    "the program's guards refuse its reference cases (fresh inputs laid out "
                    f"contiguous or channels-last, as an artifact stores them): {exc}; export "
                    "with an example laid out so"
                ) from None
        out_spec, eager_leaves, eager_paths = pytree.flatten(eager, "output")
        compiled_spec, compiled_leaves, _ = pytree.flatten(result, "output")
        if spec_to_json(out_spec, "the result") != spec_to_json(compiled_spec, "the result"):
            raise ExportError("eager and the compiled program return different structures")
        out_doc = leaves_to_json(eager_leaves, eager_paths)
        inputs.append(leaves)
        outputs["eager"].append([_own(x) for x in eager_leaves])
        outputs["compiled"].append([_own(x) for x in compiled_leaves])
        if wide is not None:
            try:
                wide_leaves = _float64_run(wide, binder, call_spec, leaves)
                problem = refs.float64_outputs(wide_leaves, eager_leaves)
            except Exception as exc:  # NOTE: a function may close over float32 tensors
                wide_leaves, problem = [], f"the float64 run raised {type(exc).__name__}: {exc}"
            if problem is not None:
                wide, anchor = None, f"none: {problem}"
            outputs["float64"].append(wide_leaves)
    if wide is None:
        del outputs["float64"]
        anchor = anchor if anchor.startswith("none") else f"none: {anchor}"
    cases = refs.ReferenceCases(inputs, outputs, binder, call_spec, out_spec, wide is not None)
    return cases, out_doc, layouts, anchor


def _cases_for_samples(values: Sequence[Any], references: int) -> int:
    """How many reference cases the gate can judge ``values`` on (a case's output and input
    leaves: it judges the inputs after the call too): each floating value needs
    ``MIN_SAMPLES`` error samples over the cases (a 0-d loss gives one per case), and the gate
    cannot draw more from the stored cases (it would draw the same inputs again)."""
    sizes = [x.numel() for x in values if isinstance(x, torch.Tensor) and _judged(x)]
    smallest = min((n for n in sizes if n > 0), default=MIN_SAMPLES)
    return max(references, -(-MIN_SAMPLES // smallest))


def _judged(x: torch.Tensor) -> bool:
    return x.dtype.is_floating_point or x.dtype.is_complex


def _rebuilt(binder: Binder, call_spec: Any, leaves: list[Any]) -> tuple[tuple, dict]:
    """The call ``(args, kwargs)`` whose flattened leaves are ``leaves``."""
    named = {}
    i = 0
    for name, sub in call_spec:
        n = count_leaves(sub)
        named[name] = pytree.unflatten(sub, leaves[i : i + n])
        i += n
    return binder.arguments(named)


def _own(x: Any) -> Any:
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _float64_run(wide: Any, binder: Binder, call_spec: Any, leaves: list[Any]) -> list[Any]:
    a, kw = _rebuilt(binder, call_spec, [refs.widen(x) for x in leaves])
    with torch.no_grad():
        result = wide(*a, **kw)
    return [_own(x) for x in pytree.flatten(result, "output")[1]]


def _judge(artifact: Artifact, cases: refs.ReferenceCases) -> Report:
    """The gate's report on the artifact, loaded here; raises when it fails, or when its
    program does not reproduce the compiled program's outputs bit for bit."""
    with warnings.catch_warnings():
        # NOTE: the export warned already of what the load would warn of again
        warnings.simplefilter("ignore", ExportWarning)
        loaded = artifact.load(trust=artifact.digest)
    for k in range(cases.count):
        a, kw = cases.call(k)
        got = pytree.flatten(loaded(*a, **kw), "output")[1]
        want = cases.outputs["compiled"][k]
        if not refs.same_bits(got, want):
            raise ExportError(
                f"the loaded artifact does not reproduce the compiled program's outputs bit for "
                f"bit on reference case {k} (a plait bug: please report it)"
            )
    report = refs.judge(loaded, cases, loaded.contract, loaded.input_outputs)
    if not report.ok:
        raise ConformanceError(report)
    return report


def _verdict_record(report: Report) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "contract_version": report.contract_version,
        "failures": [str(f) for f in report.failures],
        "notes": list(report.notes),
    }

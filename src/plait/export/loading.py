"""``plait.load``: an artifact's members, each checked, into a :class:`LoadedProgram`.

Order matters: nothing is parsed before the archive checks pass (:mod:`plait.export.archive`);
the program's text is refused before it is parsed if it names code (a ``target=`` attribute:
an opaque or random call of a Python function by name) or a file-touching ATen overload; every
static value of the parsed program is checked against the size limit before anything is built;
the captured program must hash to the artifact's semantic hash; the weights and reference
tensors must be exactly the names, dtypes and shapes the program declares; the guards rebuilt
from the stored plan must be the ones recorded at export. Only then is the program built:
native kernels loaded when trusted (:mod:`plait.export.native`), else built from the IR.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from plait.autograd.function import without_autocast
from plait.codegen import timed_choices
from plait.contract import ContractError, parse
from plait.errors import ArtifactFormatError, ExportWarning, PlaitCompileError
from plait.export import native
from plait.export.archive import Limits, Members, read_archive
from plait.export.calling import (
    Binder,
    call_spec_from_json,
    count_leaves,
    decode_value,
    leaves_from_json,
    spec_from_json,
)
from plait.export.guards import guards_from_plan
from plait.export.loaded import Bindings, Build, LoadedProgram
from plait.export.references import unpack
from plait.export.tensors import read_tensors
from plait.frontend.output_views import LAYOUTS
from plait.guards import GuardSet
from plait.guards.ambient import ambient_guards
from plait.guards.native import EVALUATORS
from plait.ir import Graph, TensorType, from_text, interpret, semantic_hash, weights_hash
from plait.manifest import Manifest

# NOTE: ATen overloads that read or write files or print: never run from an artifact
REFUSED_ATEN = ("from_file", "save", "_print", "warn")
_CODE_TEXT = re.compile(r"\btarget\s*=|\"(?:" + "|".join(REFUSED_ATEN) + r")\"")
_ATEN_OPS = ("aten", "aten_factory", "aten_check", "aten_datadep")


def load(
    path: str | Path,
    *,
    trust: str | Iterable[str] | None = None,
    limits: Limits | None = None,
) -> LoadedProgram:
    """The exported program at ``path``, ready to call (see :mod:`plait.export`)."""
    limits = limits or Limits()
    trusted = native.trusted_digests(trust)
    members = read_archive(path, limits)
    return load_members(members, Path(path).name, trusted, limits)


def load_members(
    members: Members, name: str, trusted: frozenset[str] | None, limits: Limits
) -> LoadedProgram:
    start = time.perf_counter()
    header = _header(members.index)
    from plait.runtime import StaxOptions

    _stax_options(header["stax_options"], StaxOptions())
    name = f"{header['name']} ({name})" if header["name"] != name else name
    graph = parse_program("program.ir", members.text("program.ir"), limits)
    captured = parse_program("captured.ir", members.text("captured.ir"), limits)
    if semantic_hash(captured) != header["semantic_hash"]:
        raise ArtifactFormatError(
            "captured.ir does not hash to the artifact's semantic hash: the program was changed"
        )
    calling = members.json("calling.json")
    binder, call_spec, in_leaves, bindings, constant = _calling(calling, graph, name)
    weights = _weights(members, graph, bindings, constant, limits)
    if weights_hash(weights) != header["weights_hash"]:
        raise ArtifactFormatError("weights.safetensors does not match the artifact's weights hash")
    in_types = _leaf_types(graph, bindings)
    references = unpack(
        members.read("reference.safetensors"),
        members.json("reference.json"),
        in_leaves,
        binder,
        call_spec,
        bindings.out_spec,
        in_types,
    )
    device = _device(header["device"])
    references.place(device)
    guards = _guards(members.json("guards.json"), call_spec, references)
    contract = _contract(members.text("contract.toml"))
    exported = _manifest(members.json("manifest.json"), header["semantic_hash"])
    decision = native.decide_native(native.read_index(members), trusted, members.digest, device)
    for v in graph.inputs:
        if v.name in weights:
            weights[v.name] = weights[v.name].to(device)
    graph.constants = {n: weights[n] for n in constant}
    bindings.inputs = [
        (leaf, weights.get(v.name)) for v, (leaf, _) in zip(graph.inputs, bindings.inputs)
    ]
    notes = []
    if header["executor"] != "stax":
        note = (
            f"{name}: the program runs on plait's reference interpreter: {header['executor_note']}"
        )
        warnings.warn(note, ExportWarning, stacklevel=3)
        notes.append(note)
    elif decision.status == "loaded":
        native.adopt(decision, members, _private_workdir())
    builder = _Builder(graph, header, exported, decision, notes, guards.texts())
    program = LoadedProgram(
        name=name,
        digest=members.digest,
        semantic_hash=header["semantic_hash"],
        format_version=header["version"],
        binder=binder,
        guards=guards,
        bindings=bindings,
        make_build=builder,
        native=decision.record(),
        references=references,
        contract=contract,
        notes=notes,
    )
    program.native = builder.decision.record()
    program.builds[0].manifest.timings["export.load"] = time.perf_counter() - start
    return program


def _private_workdir() -> Path:
    from plait.ir.private_files import fresh_private_dir

    return fresh_private_dir("plait-load-")


# --- the program ---------------------------------------------------------------------------------
def parse_program(member: str, text: str, limits: Limits) -> Graph:
    """The program text of ``member``, refused before parsing if it names code (see the module
    doc), then parsed, verified and checked against the size limit."""
    found = _CODE_TEXT.search(text)
    if found:
        raise ArtifactFormatError(
            f"{member}: the program names code ({found.group(0)!r} at character {found.start()}): "
            "an artifact's program runs plait's ops and ATen kernels only"
        )
    try:
        graph = from_text(text)
    except RecursionError:
        raise ArtifactFormatError(f"{member}: nested too deep") from None
    except Exception as exc:  # NOTE: a parser of untrusted text may fail in any way
        raise ArtifactFormatError(f"{member}: not a valid program ({exc})") from None
    for node in graph.nodes:
        if "target" in node.attrs:
            raise ArtifactFormatError(
                f"{member}: node {node.id} ({node.op}) names a Python callable"
            )
        if node.op in _ATEN_OPS and str(node.attrs.get("name")) in REFUSED_ATEN:
            raise ArtifactFormatError(f"{member}: node {node.id} runs aten.{node.attrs['name']}")
    values = list(graph.inputs) + [v for n in graph.nodes for v in n.outputs]
    for v in values:
        t = v.type
        if isinstance(t, TensorType) and t.is_static:
            size = math.prod(int(d) for d in t.shape) * t.dtype.itemsize
            if size > limits.tensor_bytes:
                raise ArtifactFormatError(
                    f"{member}: value %{v.name} is {t} ({size} bytes), past the load's limit "
                    f"of {limits.tensor_bytes}"
                )
    return graph


class _Builder:
    """Builds the program for the settings of the moment (a :class:`Build`); the first build
    decides what happened to the native kernels."""

    def __init__(
        self,
        graph: Graph,
        header: dict[str, Any],
        exported: Manifest,
        decision: native.NativeDecision,
        notes: list[str],
        guards: list[str],
    ) -> None:
        self.graph, self.header, self.exported = graph, header, exported
        self.decision, self.notes, self.guards = decision, notes, guards

    def __call__(self, reason: str | None) -> Build:
        start = time.perf_counter()
        settings = GuardSet(ambient_guards(), EVALUATORS)
        m = Manifest(source_hash=self.header["semantic_hash"], options=self._options())
        m.passes = list(self.exported.passes)
        m.graph = dict(self.exported.graph)
        m.guards = [*self.guards, *settings.texts()]
        if self.header["executor"] != "stax":
            graph = self.graph

            def run(values: list[Any]) -> Any:
                return without_autocast(interpret, graph, values, False)

            m.executor = {
                "backend": "eager",
                "evidence": {"counts": {"interpreted": len(graph.nodes)}},
            }
            m.fallbacks.append({"what": "native backend", "reason": self.header["executor_note"]})
            m.cache = {"status": "interpreter", "events": list(self.notes)}
            m.timings["export.build"] = time.perf_counter() - start
            return Build(run, settings, m, reason)
        program, triton_built = self._stax()
        if reason is None:
            self.decision = native.check_adopted(self.decision, program, triton_built)
        _records(program, m)
        m.cache = {
            "status": f"native kernels {self.decision.status}",
            "events": [self.decision.reason],
        }
        m.timings["export.build"] = time.perf_counter() - start

        def execute(values: list[Any]) -> Any:
            return without_autocast(program, *values)

        return Build(execute, settings, m, reason, program)

    def _options(self) -> dict[str, Any]:
        backend = "stax" if self.header["executor"] == "stax" else "eager"
        return {"backend": backend, "artifact_format": self.header["version"]}

    def _stax(self) -> tuple[Any, list[str] | None]:
        from plait.runtime import CodegenError, StaxOptions, compile_graph

        opts = _stax_options(self.header["stax_options"], StaxOptions())
        opts["strict"] = False
        opts["jobs"] = self.decision.jobs if self.decision.status == "loaded" else None
        options = StaxOptions(**opts)
        workdir, self.decision.workdir = self.decision.workdir, None
        # NOTE: the exporting compile's timed library choices (a match on its machine only)
        timed = timed_choices.replaying(_timed(self.header.get("timed_choices", {})))
        try:
            if workdir is None:
                with timed:
                    return compile_graph(self.graph, options=options), None
            from plait.codegen.triton_carry import serving

            # NOTE: the first build only: the carried kernels stay loaded in this process
            with serving(workdir) as built, timed:
                program = compile_graph(self.graph, options=options)
            return program, built
        except CodegenError as exc:
            raise PlaitCompileError(f"the artifact's program does not build here: {exc}") from exc
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)


def _timed(doc: Any) -> dict[str, str | None]:
    """``timed_choices``: digest (64 hex digits) -> None (oneDNN ran) or the refusal's text."""
    if not isinstance(doc, dict) or not all(
        isinstance(k, str)
        and timed_choices.DIGEST.fullmatch(k)
        and (v is None or isinstance(v, str))
        for k, v in doc.items()
    ):
        raise ArtifactFormatError("artifact.json: timed_choices is not digest -> null or text")
    return dict(doc)


def _stax_options(doc: dict[str, Any], defaults: Any) -> dict[str, Any]:
    """The recorded Stax options, each of its field's type (``jobs``: an int or null), counts
    positive, a known target."""
    known = dataclasses.asdict(defaults)
    for key, value in doc.items():
        if key not in known:
            raise ArtifactFormatError(f"artifact.json: stax_options has no field {key!r}")
        want = known[key]
        ok = type(value) is type(want) or (key == "jobs" and (value is None or type(value) is int))
        if type(value) is int and value < (1 if key in ("kernels_per_unit", "jobs") else 0):
            ok = False
        if key == "target" and value not in ("auto", "cpu", "triton"):
            ok = False
        if not ok:
            raise ArtifactFormatError(f"artifact.json: stax_options {key}={value!r}")
    try:  # NOTE: the options' own checks (a known kernel printer, a count of TVM trials)
        type(defaults)(**doc)
    except (TypeError, ValueError) as exc:
        raise ArtifactFormatError(f"artifact.json: stax_options: {exc}") from exc
    return dict(doc)


def _records(program: Any, m: Manifest) -> None:
    """The build's records in the manifest (as ``plait.compile`` writes them)."""
    records = program.records()
    m.kernels = {"kernels": records.pop("kernels", []), "schedule": records.pop("schedule", [])}
    m.toolchain["cxx" if records.get("target") == "cpu" else "triton"] = records.pop(
        "toolchain", {}
    )
    m.timings.update({f"stax.{k}": v for k, v in records.pop("timings", {}).items()})
    m.executor = records
    for n in records.get("evidence", {}).get("nodes", []):
        if n["executor"] == "fallback":
            m.fallbacks.append({"what": f"node {n['id']} ({n['op']})", "reason": n["detail"]})


# --- the members ---------------------------------------------------------------------------------
_HEADER_FIELDS: dict[str, type] = {
    "semantic_hash": str,
    "weights_hash": str,
    "executor": str,
    "executor_note": str,
    "device": str,
    "stax_options": dict,
    "version": int,
    "name": str,
}


def _header(index: dict[str, Any]) -> dict[str, Any]:
    for key, kind in _HEADER_FIELDS.items():
        if not isinstance(index.get(key), kind):
            raise ArtifactFormatError(f"artifact.json: {key!r} is missing or not a {kind.__name__}")
    if not re.fullmatch(r"[0-9a-f]{64}", index["semantic_hash"]):
        raise ArtifactFormatError("artifact.json: the semantic hash is not 64 hex digits")
    if index["executor"] not in ("stax", "interpreter"):
        raise ArtifactFormatError(f"artifact.json: executor {index['executor']!r}")
    _timed(index.get("timed_choices", {}))
    return index


def _device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ArtifactFormatError(f"artifact.json: device {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PlaitCompileError(
            f"the artifact's program runs on {text}, and this machine has no CUDA device"
        )
    if device.type not in ("cpu", "cuda"):
        raise ArtifactFormatError(f"artifact.json: device {text!r} is neither cpu nor cuda")
    return device


def _calling(
    doc: Any, graph: Graph, name: str
) -> tuple[Binder, Any, list[dict[str, Any]], Bindings, list[str]]:
    """The signature, the call's structure and leaves, where each program input comes from and
    how outputs come back; and the weights the program holds as constants."""
    if not isinstance(doc, dict):
        raise ArtifactFormatError("calling.json is not a JSON object")
    try:
        binder = Binder.from_json(doc["signature"], name)
        call_spec = call_spec_from_json(doc["call"])
        in_leaves = leaves_from_json(doc["leaves"])
        out_spec = spec_from_json(doc["outputs"]["spec"])
        inputs, out_leaves = doc["inputs"], doc["outputs"]["leaves"]
    except (KeyError, TypeError) as exc:
        raise ArtifactFormatError(f"calling.json: {exc!r} is missing or malformed") from None
    if sum(count_leaves(s) for _, s in call_spec) != len(in_leaves):
        raise ArtifactFormatError("calling.json: the leaves do not fit the call's structure")
    if not isinstance(inputs, list) or len(inputs) != len(graph.inputs):
        raise ArtifactFormatError("calling.json: 'inputs' does not list each program input")
    binding: list[tuple[int | None, Any]] = []
    constant = []
    for v, entry in zip(graph.inputs, inputs):
        if not isinstance(entry, dict) or entry.get("name") != v.name:
            raise ArtifactFormatError(f"calling.json: the input entry of %{v.name} is malformed")
        leaf = entry.get("leaf")
        if leaf is None:
            binding.append((None, None))
            if entry.get("constant") is True:
                constant.append(v.name)
            continue
        if type(leaf) is not int or not 0 <= leaf < len(in_leaves):
            raise ArtifactFormatError(f"calling.json: %{v.name} names leaf {leaf!r}")
        if in_leaves[leaf]["kind"] != "tensor" or not isinstance(v.type, TensorType):
            raise ArtifactFormatError(f"calling.json: %{v.name} is bound to a non-tensor leaf")
        binding.append((leaf, None))
    if not isinstance(out_leaves, list) or len(out_leaves) != count_leaves(out_spec):
        raise ArtifactFormatError("calling.json: the output leaves do not fit their structure")
    outs = [_out_leaf(e, len(graph.outputs), in_leaves) for e in out_leaves]
    return binder, call_spec, in_leaves, Bindings(binding, out_spec, outs), constant


def _out_leaf(entry: Any, n_outputs: int, in_leaves: list[dict[str, Any]]) -> tuple[str, Any]:
    bad = ArtifactFormatError(f"calling.json: output leaf {str(entry)[:80]!r} is malformed")
    if not isinstance(entry, dict):
        raise bad
    kind = entry.get("from")
    if kind == "value":
        return ("value", decode_value(entry.get("value"), "an output value"))
    if kind == "output":
        index, tracer, fresh = entry.get("index"), entry.get("tracer"), entry.get("fresh")
        layout = entry.get("layout")  # NOTE: the memory format eager gave it (None: as it is)
        if layout is not None and layout not in LAYOUTS:
            raise bad
        if type(index) is int and 0 <= index < n_outputs and type(tracer) is int:
            return ("output", (index, tracer, bool(fresh), layout))
        raise bad
    if kind == "view":
        view = _view_leaf(entry, n_outputs)
        if view is None:
            raise bad
        return ("view", view)
    leaf = entry.get("leaf")
    if type(leaf) is not int or not 0 <= leaf < len(in_leaves):
        raise bad
    if in_leaves[leaf]["kind"] != "tensor":
        raise bad
    if kind == "leaf":
        return ("leaf", leaf)
    if kind == "alias":
        try:
            size = tuple(int(x) for x in entry["size"])
            stride = tuple(int(x) for x in entry["stride"])
            offset = int(entry["offset"])
            dtype = None if entry.get("dtype") is None else decode_value(entry["dtype"], "dtype")
        except (KeyError, TypeError, ValueError):
            raise bad from None
        return ("alias", (leaf, size, stride, offset, dtype))
    raise bad


def _view_leaf(entry: dict[str, Any], n_outputs: int) -> tuple[Any, ...] | None:
    """A view of another output (:mod:`plait.frontend.output_views`), as the runtime reads it;
    None where the entry is malformed."""
    try:
        index, tracer, offset = entry["index"], entry["tracer"], int(entry["offset"])
        size, stride, base_size, base_stride = (
            tuple(int(x) for x in entry[k]) for k in ("size", "stride", "base_size", "base_stride")
        )
        dtype = entry.get("dtype")
    except (KeyError, TypeError, ValueError):
        return None
    if type(index) is not int or not 0 <= index < n_outputs or type(tracer) is not int:
        return None
    if dtype is not None and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
        return None
    reread = () if dtype is None else (str(dtype),)
    return (index, tracer, size, stride, offset, False, base_size, base_stride, *reread)


def _weights(
    members: Members, graph: Graph, bindings: Bindings, constant: list[str], limits: Limits
) -> dict[str, torch.Tensor]:
    expected = {}
    for v, (leaf, _) in zip(graph.inputs, bindings.inputs):
        if leaf is not None:
            continue
        t = v.type
        if not isinstance(t, TensorType) or not t.is_static:
            raise ArtifactFormatError(f"program.ir: weight %{v.name} is {t}: not a static tensor")
        expected[v.name] = (t.dtype, tuple(int(d) for d in t.shape))
    return read_tensors("weights.safetensors", members.read("weights.safetensors"), expected)


def _leaf_types(
    graph: Graph, bindings: Bindings
) -> dict[int, tuple[torch.dtype, tuple[int, ...] | None]]:
    """Each tensor leaf's dtype and static shape (None where a dim is symbolic), as the program
    declares it; a leaf no program input reads is not listed."""
    out: dict[int, tuple[torch.dtype, tuple[int, ...] | None]] = {}
    for v, (leaf, _) in zip(graph.inputs, bindings.inputs):
        if leaf is not None and isinstance(v.type, TensorType):
            shape = tuple(int(d) for d in v.type.shape) if v.type.is_static else None
            out[leaf] = (v.type.dtype, shape)
    return out


def _guards(doc: Any, call_spec: Any, references: Any) -> GuardSet:
    if not isinstance(doc, dict):
        raise ArtifactFormatError("guards.json is not a JSON object")
    leaves = references.inputs[0]
    _, _, paths = references.binder.flatten(*references.call(0))
    guards = guards_from_plan(doc.get("plan"), call_spec, leaves, paths)
    recorded = doc.get("carried")
    rebuilt = [g.text for g in guards if not g.batch]
    if recorded != rebuilt:
        raise ArtifactFormatError(
            "guards.json: the guards rebuilt from the stored plan are not the ones recorded at "
            "export"
        )
    return guards


def _contract(text: str) -> Any:
    try:
        return parse(text, source="contract.toml")
    except ContractError as exc:
        raise ArtifactFormatError(f"contract.toml: {exc}") from None


def _manifest(doc: Any, source_hash: str) -> Manifest:
    try:
        m = Manifest.from_json(doc)
    except (ValueError, TypeError) as exc:
        raise ArtifactFormatError(f"manifest.json: {exc}") from None
    if m.source_hash != source_hash:
        raise ArtifactFormatError("manifest.json names another program (its source hash)")
    return m

"""Standalone reproducers: a directory that re-creates a divergence with plait alone.

A repro directory holds ``graph.ir`` (the minimal graph, canonical IR text), ``inputs.safetensors``
(its inputs and constants, with their strides in ``repro.json``), ``repro.json`` (the stage, the
pass or the Stax options, what was found, versions) and ``repro.py`` (``python repro.py`` exits 1
while the divergence reproduces, 0 once it is gone). :func:`rerun` re-runs it in this process.

A ``pass`` repro runs the pass on the graph and judges the output graph against the input graph
(:func:`plait.diagnose.replay.localize_pass`); a ``backend`` repro compiles the graph with Stax
and judges every step against the interpreter (:func:`plait.diagnose.backend.traced_run`). A
user's pass is imported from the module that registered it (``pass_modules``).

Example:
    >>> import tempfile, torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((4,), torch.float32))
    >>> gb.output(gb.call("exp", x))
    >>> d = write_repro(tempfile.mkdtemp(), gb.build(), {"x": torch.randn(4)},
    ...                 stage="backend", stax={})
    >>> rerun(d).reproduced
    False
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from plait.diagnose.replay import Divergence, PassStep, localize_pass, raised
from plait.errors import InvalidOptionError, StoreFormatError, UnknownNameError
from plait.ir import Graph, from_text, to_text
from plait.passes import all_passes, get_pass, run_pipeline

FORMAT = "plait.repro/1"
STAGES = ("pass", "backend")

_SCRIPT = '''"""plait reproducer: {summary}

Run it with plait installed: ``python repro.py``. It exits 1 while the divergence reproduces and
0 once it is gone; ``plait diagnose {name}`` does the same.
"""

import sys
from pathlib import Path

from plait.diagnose import rerun

result = rerun(Path(__file__).resolve().parent)
print(result)
sys.exit(1 if result.reproduced else 0)
'''


@dataclass
class Rerun:
    """What re-running a repro found: ``reproduced`` (a divergence beyond the contract),
    ``divergence`` (where, with the gate's measure), the ``stage`` and ``pass_name``."""

    reproduced: bool
    stage: str
    pass_name: str | None
    divergence: Divergence | None
    nodes: int
    expected: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        what = f"pass {self.pass_name!r}" if self.stage == "pass" else "the Stax backend"
        if not self.reproduced:
            return (
                f"not reproduced: {what} computes the {self.nodes}-node graph within the contract"
            )
        d = self.divergence
        assert d is not None
        line = d.node_line()
        return f"reproduced: {what} diverges at {line or d.value}: {d.measure}"


def pass_modules(pipeline: list[str]) -> list[str]:
    """The modules outside plait that registered passes of ``pipeline`` (importable ones)."""
    out = []
    for name in pipeline:
        module = getattr(get_pass(name).fn, "__module__", "")
        if module and not module.startswith("plait.") and module != "__main__":
            out.append(module)
    return sorted(set(out))


def write_repro(
    directory: str | Path,
    graph: Graph,
    inputs: Mapping[str, Any],
    *,
    stage: str,
    pass_name: str | None = None,
    stax: Mapping[str, Any] | None = None,
    found: Mapping[str, Any] | None = None,
) -> Path:
    """Write a repro of ``graph`` on ``inputs`` (values of its inputs by name; constants are
    read from ``graph.constants`` where ``inputs`` lacks them) to ``directory``."""
    from safetensors.torch import save_file

    if stage not in STAGES:
        raise InvalidOptionError(f"stage must be one of {STAGES}, got {stage!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    strides: dict[str, list[int]] = {}
    scalars: dict[str, Any] = {}
    for v in graph.inputs:
        value = inputs[v.name] if v.name in inputs else graph.constants.get(v.name)
        if isinstance(value, torch.Tensor):
            tensors[v.name] = value.detach().contiguous().clone()
            strides[v.name] = list(value.stride())
        else:
            scalars[v.name] = value
    save_file(tensors, str(out / "inputs.safetensors"))
    (out / "graph.ir").write_text(to_text(graph) + "\n")
    modules = pass_modules([pass_name]) if pass_name else []
    meta = {
        "format": FORMAT,
        "stage": stage,
        "pass": pass_name,
        "pass_modules": modules,
        "stax": dict(stax or {}),
        "strides": strides,
        "scalars": scalars,
        "found": dict(found or {}),
        "nodes": len(graph.nodes),
        "versions": _versions(),
    }
    (out / "repro.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    where = f"pass {pass_name!r}" if stage == "pass" else "the Stax backend"
    summary = f"{where} diverges on a {len(graph.nodes)}-node graph"
    (out / "repro.py").write_text(_SCRIPT.format(summary=summary, name=out.name))
    return out


def load_repro(directory: str | Path) -> tuple[Graph, dict[str, Any], dict[str, Any]]:
    """The graph, its inputs (by name, with their recorded strides) and the metadata."""
    from safetensors.torch import load_file

    d = Path(directory)
    meta = json.loads((d / "repro.json").read_text())
    if meta.get("format") != FORMAT:
        raise StoreFormatError(
            f"{d}: not a plait repro (format {meta.get('format')!r}, want {FORMAT})"
        )
    graph = from_text((d / "graph.ir").read_text())
    loaded = load_file(str(d / "inputs.safetensors"))
    inputs: dict[str, Any] = dict(meta.get("scalars", {}))
    for name, t in loaded.items():
        strides = meta.get("strides", {}).get(name)
        if strides is not None and list(t.stride()) != strides and t.numel():
            laid = torch.empty_strided(t.shape, tuple(strides), dtype=t.dtype)
            laid.copy_(t)
            t = laid
        inputs[name] = t
    for v in graph.inputs:
        if v.kind == "const" and v.name in inputs:
            graph.constants[v.name] = inputs[v.name]
    return graph, inputs, meta


def rerun(directory: str | Path) -> Rerun:
    """Re-run the repro in ``directory``: does its divergence still reproduce?

    Example: see the module docstring."""
    graph, inputs, meta = load_repro(directory)
    stage = meta["stage"]
    if stage == "pass":
        name = meta["pass"]
        for module in meta.get("pass_modules", []):
            importlib.import_module(module)
        if name not in all_passes():
            raise UnknownNameError(
                f"the repro runs pass {name!r}, which no imported module registers; import the "
                "module that registers it (plait.passes.register_pass) before rerun"
            )
        found = pass_divergence(graph, inputs, name)
    elif stage == "backend":
        found = backend_divergence(graph, inputs, meta.get("stax", {}))
    else:
        raise StoreFormatError(f"unknown repro stage {stage!r}")
    reproduced = found is not None and found.exceeded
    return Rerun(
        reproduced, stage, meta.get("pass"), found, len(graph.nodes), meta.get("found", {})
    )


def pass_divergence(graph: Graph, inputs: Mapping[str, Any], pass_name: str) -> Divergence | None:
    """Run pass ``pass_name`` on ``graph`` and judge its output against it on ``inputs``."""
    params = {v.name: inputs[v.name] for v in graph.inputs if v.kind in ("param", "buffer")}
    try:
        result = run_pipeline(graph, [pass_name], params=params)
    except Exception as exc:
        return raised(exc, graph="before")
    step = PassStep(0, pass_name, graph, result.graph, result.records[0])
    return localize_pass(step, inputs)


def backend_divergence(
    graph: Graph, inputs: Mapping[str, Any], stax: Mapping[str, Any]
) -> Divergence | None:
    """Compile ``graph`` with Stax (options ``stax``) and judge every step on ``inputs``."""
    from plait.diagnose.backend import alias_divergence, traced_run
    from plait.diagnose.values import evaluate
    from plait.runtime import StaxOptions, compile_graph

    try:
        program = compile_graph(graph, options=StaxOptions(**stax))
    except Exception as exc:
        return raised(exc)
    found = traced_run(program, inputs, evaluate(graph, inputs))
    if found is None or not found.exceeded:
        return alias_divergence(program, inputs) or found
    return found


def _versions() -> dict[str, str]:
    import plait

    return {
        "plait": plait.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }

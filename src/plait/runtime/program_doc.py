"""The native Stax program's saved form: :func:`program_to_doc` records what a rebuild must
reproduce (each step's result layouts, the oneDNN calls refused at compile time, the schedule,
the kernels' source hashes, the options, each C++ kernel's text under the digest of its
structure) and the prepacked weights' bytes as blobs; :func:`program_from_doc` rebuilds the
program from the graph, that document and its blobs (replaying the recorded decisions: no probe,
no dry run; a kernel whose structure has a recorded text is not printed again) and refuses
one that does not reproduce the recorded schedule and kernels (:class:`ProgramDocError`). The
cache stores the document and the blobs; what is inside them is this module's. NOTE: the code
generator is imported when a program is rebuilt, not with this module (the cache imports it)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from plait.ir import Graph
from plait.ir.persist import Blobs

PACKED = "prepacked:"  # NOTE: blob names: PACKED + "data:" / "md:" + the weight's key


class ProgramDocError(Exception):
    """A saved program document that does not rebuild the program it records."""


def program_to_doc(program: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The saved plan, and the blobs it refers to (the prepacked weights' bytes)."""
    layouts = program.layouts()
    packs = program.prepacked()
    blobs = {}
    for key, pack in packs.items():
        blobs[f"{PACKED}data:{key}"], blobs[f"{PACKED}md:{key}"] = pack.data, pack.md
    record = {
        "layouts": {str(k): [list(s) for s in v] for k, v in layouts.items()},
        "schedule": _schedule(program),
        "kernels": [k.source_sha256 for k in program.kernels],
        "options": program.options.record(),
        "prepacked": {
            k: {
                "shape": list(p.shape),
                "dtype": str(p.dtype).removeprefix("torch."),
                **({} if p.finite is None else {"finite": p.finite}),
            }
            for k, p in packs.items()
        },
    }
    refused = getattr(layouts, "refused", None)  # NOTE: the compile's oneDNN decisions
    if refused is not None:
        record["refused"] = {str(k): dict(v) for k, v in sorted(refused.items())}
    printed = _printed(program)
    if printed:
        record["printed"] = printed
    return record, blobs


def _printed(program: Any) -> dict[str, str]:
    """Each C++ kernel's text (its symbol spelled ``STAX_SYMBOL``, as printed) by the digest of
    its structure: a rebuild takes the text instead of printing the kernel again."""
    from plait.codegen.kernel_digest import structure_digest

    out = {}
    for low, info in zip(program.plan.kernels, program.kernels):
        if info.printer != "cpp" or not info.source:
            continue
        text = info.source.replace(info.symbol, "STAX_SYMBOL", 1)
        if hashlib.sha256(text.encode()).hexdigest() == info.source_sha256:
            out[structure_digest(low.kernel)] = text
    return out


def _schedule(program: Any) -> list[str]:
    """The schedule without node ids (ids do not survive the text round trip; positions do)."""
    return [s.get("name") or s.get("op", "?") for s in program.schedule()]


def _saved_packs(plan: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    from plait.codegen.onednn import SavedPack

    out = {}
    for key, info in plan.get("prepacked", {}).items():
        data, md = tensors.get(f"{PACKED}data:{key}"), tensors.get(f"{PACKED}md:{key}")
        if data is None or md is None:
            raise ProgramDocError(f"the prepacked weight {key} is missing from the entry")
        dtype = getattr(torch, info["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise ProgramDocError(f"the prepacked weight {key} has dtype {info['dtype']!r}")
        finite = info.get("finite")
        if finite not in (None, True, False):
            raise ProgramDocError(f"the prepacked weight {key} has finite {finite!r}")
        shape = tuple(int(d) for d in info["shape"])
        out[key] = SavedPack(data, md, shape, dtype, finite=finite)
    return out


def _saved_layouts(plan: dict[str, Any], tensors: dict[str, torch.Tensor], gate: Any) -> Any:
    from plait.codegen.plan import STAGES, SavedLayouts

    layouts = {int(k): [tuple(int(x) for x in s) for s in v] for k, v in plan["layouts"].items()}
    if "refused" not in plan:  # NOTE: no decisions recorded: the planner probes them
        if gate is not None:
            gate()  # NOTE: a probe runs oneDNN on the constants: only on a verified entry
        return layouts
    refused = plan["refused"]
    if not isinstance(refused, dict) or not all(
        isinstance(v, dict) and all(s in STAGES and isinstance(r, str) for s, r in v.items())
        for v in refused.values()
    ):
        raise ProgramDocError("the saved plan's oneDNN decisions are malformed")
    refused_at = {int(k): v for k, v in refused.items()}
    printed = plan.get("printed", {})
    if not isinstance(printed, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in printed.items()
    ):
        raise ProgramDocError("the saved plan's kernel texts are malformed")
    # NOTE: checked before any text reaches the kernel cache or the compiler
    kernels = set(plan["kernels"])
    if any(hashlib.sha256(t.encode()).hexdigest() not in kernels for t in printed.values()):
        raise ProgramDocError("a saved kernel text is not one of the recorded kernels")
    return SavedLayouts(layouts, refused_at, _saved_packs(plan, tensors), gate, printed)


def program_from_doc(graph: Graph, plan: dict[str, Any], blobs: Blobs) -> Any:
    """The program ``plan`` records, rebuilt on ``graph`` with ``blobs`` (their ``verified``
    gate runs before anything native reads their data)."""
    from plait.runtime.program import StaxOptions, compile_graph

    # NOTE: the options are part of the key, so the recorded ones are the requested ones.
    options = StaxOptions(**plan["options"])
    try:
        layouts = _saved_layouts(plan, dict(blobs.tensors), blobs.verified)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProgramDocError(f"the saved plan does not load: {exc!r}") from None
    program = compile_graph(graph, options=options, layouts=layouts)
    if _schedule(program) != plan["schedule"]:
        raise ProgramDocError("the rebuilt Stax schedule differs from the recorded one")
    if [k.source_sha256 for k in program.kernels] != plan["kernels"]:
        raise ProgramDocError("the rebuilt Stax kernels differ from the recorded ones")
    return program

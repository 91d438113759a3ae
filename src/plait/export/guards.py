"""An exported program's guards: which of its specialization's guards an artifact carries, and
how a load rebuilds them without the model's code.

Capture records what a program's behaviour depended on as a plan (:class:`GuardPlan`: input
types, the size comparisons it made, the symbols of dynamic dims, layout reads). The artifact
stores that plan as JSON, without the Python values the program read (those belong to the
model's code), and a load rebuilds the guards from it and a stored reference call, through the
same builder capture uses (:func:`plait.frontend.guard_plan.build_guards`).

Carried, checked on every call: the call's structure, each tensor's dtype, shape and device,
``requires_grad``, the size comparisons and symbolic-size relations, plain arguments' values,
layout reads. Discharged by the export itself, each for a recorded reason: the model's state
and the Python values read (fixed into the artifact), grad mode and autocast (a loaded program
runs with both off), the default dtype (an exported program's dtypes are written out). The
compile's call settings are checked against those the program was built under on the loading
machine (:mod:`plait.export.loaded`).

Example:
    >>> discharged_reason("grad_mode", "torch.is_grad_enabled()").startswith("a loaded")
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from plait.errors import ArtifactFormatError
from plait.frontend.guard_plan import GuardPlan, build_guards
from plait.guards.guard import Guard, GuardSet
from plait.guards.native import EVALUATORS

_DISCHARGED = {
    "grad_mode": "a loaded program runs with gradients off (an inference program)",
    "state": "the model's parameters and buffers are fixed into the artifact",
    "training": "the modules' training flags are fixed into the artifact",
    "python": "the Python values the program read are fixed into the artifact",
}
_DISCHARGED_AMBIENT = {
    "torch.get_default_dtype()": "the exported program's dtypes are written out in its IR",
    "torch.autocast": "a loaded program runs with autocast off (capture wrote autocast's casts)",
}
_FORMAT = "an exported program returns each output in the memory format of the example's call"
SETTINGS = "checked against the settings the program was built under where it is loaded"


def discharged_reason(kind: str, source: str) -> str | None:
    """Why a guard of ``kind`` reading ``source`` is not carried, or None (it is)."""
    if kind == "layout" and source == "memory format":
        return _FORMAT
    if kind == "ambient":
        return _DISCHARGED_AMBIENT.get(source, SETTINGS)
    return _DISCHARGED.get(kind)


def portable_plan(plan: GuardPlan) -> dict[str, Any]:
    """The plan as the artifact stores it: JSON, without the Python values read."""
    return dataclasses.replace(plan, pyroots=None, pyreads=[]).to_json()


def guards_from_plan(
    doc: Any, call_spec: Any, leaves: Sequence[Any], paths: Sequence[str]
) -> GuardSet:
    """The carried guards of a stored plan for the call ``(call_spec, leaves)``."""
    if not isinstance(doc, dict) or doc.get("pyreads") != []:
        raise ArtifactFormatError("guards.json: 'plan' is not a plan without Python reads")
    try:
        plan = GuardPlan.from_json(doc)
    except Exception as exc:  # NOTE: a parser of untrusted data may fail in any way
        raise ArtifactFormatError(f"guards.json: the plan does not load ({exc!r})") from None
    with torch.no_grad():
        built = build_guards(plan, call_spec, leaves, paths)
    carried = [g for g in built if discharged_reason(g.kind, g.source) is None]
    return GuardSet(carried, EVALUATORS)


def guard_records(guards: Sequence[Guard]) -> list[dict[str, Any]]:
    """Every guard of the exported specialization, and what became of it."""
    out = []
    for g in guards:
        if g.batch:
            continue
        why = discharged_reason(g.kind, g.source)
        out.append({"kind": g.kind, "text": g.text, "carried": why is None, "why": why or ""})
    return out

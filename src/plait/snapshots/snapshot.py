"""A captured program as a JSON document, and back, for a warm start that does not capture.

:func:`program_doc` writes everything a :class:`CapturedProgram` holds besides the call: the
graph (IR text), where its inputs come from, the output structure, the writes back, the guard
plan and the guards' key texts. :func:`program_from_doc` rebuilds the program for a new call:
the guards come from the plan and the call, and must write the same key texts as capture's did,
else :class:`Unpinnable` says the call is not one the document was made for. Loading reads JSON
and IR text only: it never imports, unpickles or runs code from the document.

A program that cannot be written (a constant tensor captured from the program's environment, an
output holding an arbitrary object, a type that cannot be found again by name) raises
:class:`Unpinnable` when written: it is captured on every warm start.

Example:
    >>> import torch
    >>> from plait.frontend import InputAdapter, capture_program
    >>> f = lambda x: (x * 2, x.shape[0])
    >>> x = torch.randn(3)
    >>> doc = program_doc(capture_program(f, (x,)))
    >>> spec, leaves, paths = InputAdapter(f).flatten((x,), {})
    >>> prog = program_from_doc(doc, spec, leaves, paths)
    >>> [n.op for n in prog.graph.nodes], prog.out_leaves[1].ref
    (['mul'], 3)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import torch

from plait.frontend.guard_plan import GuardPlan, build_guards, const_slots
from plait.frontend.output_views import LAYOUTS
from plait.frontend.program import CapturedProgram, InputSlot, OutputLeaf
from plait.frontend.state import ModuleState
from plait.guards.guard import GuardEnv
from plait.ir import Graph, Value, from_text, to_text
from plait.ir.parser import graph_interface
from plait.snapshots.fingerprint import Unpinnable

# NOTE: /2: each graph output's eager memory format (out_layouts)
FORMAT = "plait.program/2"


# --- values ---------------------------------------------------------------------------------
def encode(value: Any) -> Any:
    """``value`` (primitives, tuples, lists, dicts, types, dtypes, devices, sizes) as JSON."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, type):
        if "<" in value.__qualname__:
            raise Unpinnable(f"type {value.__qualname__} cannot be found again by name")
        fields = _fields(value)
        if fields is None:
            return {"type": [value.__module__, value.__qualname__]}
        return {"type": [value.__module__, value.__qualname__, fields]}
    if isinstance(value, tuple) and type(value) is tuple:
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list) and type(value) is list:
        return {"list": [encode(v) for v in value]}
    raise Unpinnable(f"a {type(value).__name__} in the program's output has no saved form")


def decode(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    ((tag, body),) = doc.items()
    if tag == "size":
        return torch.Size(body)
    if tag == "dtype":
        dtype = getattr(torch, body, None)
        if not isinstance(dtype, torch.dtype):
            raise Unpinnable(f"dtype {body} is unknown to this PyTorch")
        return dtype
    if tag == "device":
        return torch.device(body)
    if tag == "type":
        return _find_type(*body)
    if tag == "tuple":
        return tuple(decode(v) for v in body)
    if tag == "list":
        return [decode(v) for v in body]
    raise Unpinnable(f"unknown saved value {tag!r}")


def _fields(cls: type) -> list[str] | None:
    """The fields a namedtuple or dataclass type is built from (a structure's rebuild depends
    on them), else None."""
    if issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple):
        return [str(f) for f in cls._fields]  # type: ignore[attr-defined]
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init]
    return None


def _find_type(module: str, qualname: str, fields: list[str] | None = None) -> type:
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type):
        raise Unpinnable(f"type {module}.{qualname} is not loaded in this process")
    if _fields(obj) != fields:
        raise Unpinnable(f"type {module}.{qualname} has other fields than at the capture")
    return obj


# --- programs -------------------------------------------------------------------------------
class SnapshotUnreadable(Unpinnable):
    """A snapshot program's nodes did not parse (found only when they are needed: an artifact
    miss). ``key``: the snapshot entry's key, for the caller to remove it."""

    def __init__(self, message: str, key: str | None) -> None:
        super().__init__(message)
        self.key = key


class SnapshotProgram(CapturedProgram):
    """A program loaded from a snapshot. Its graph's text is parsed on first use of
    :attr:`graph`: a warm start whose artifact is in the cache needs only the program's
    :meth:`interface` (its inputs, read here, and the names it returns), not its nodes.

    NOTE: no verifier run on either parse: the text is what ``to_text`` wrote of a verified
    graph, in an entry checked against its own hash and keyed by the plait version that wrote
    it. The inputs are parsed when the program loads, so a text this plait cannot read fails
    there (and is replaced by a capture)."""

    def __init__(self, text: str, **fields: Any) -> None:
        self._text = text
        self._graph: Graph | None = None
        self._interface = graph_interface(text)
        self.snapshot_key: str | None = None  # NOTE: the entry it came from (set by its loader)
        super().__init__(graph=None, **fields)

    @property
    def graph(self) -> Graph:
        """The captured graph (parsed on first use); raises :class:`SnapshotUnreadable`."""
        if self._graph is None:
            try:
                self._graph = from_text(self._text, verify=False)
            except Exception as exc:  # NOTE: the caller removes the snapshot and captures
                raise SnapshotUnreadable(
                    f"its graph does not parse ({type(exc).__name__}: {exc})", self.snapshot_key
                ) from None
        return self._graph

    @graph.setter
    def graph(self, value: Graph | None) -> None:
        self._graph = value

    @property
    def has_graph(self) -> bool:
        return True

    def interface(self) -> tuple[list[Value], frozenset[str]]:
        if self._graph is not None:
            return super().interface()
        inputs, returned = self._interface
        return inputs, frozenset(returned)


def program_doc(prog: CapturedProgram) -> dict[str, Any]:
    """``prog`` as JSON; raises :class:`Unpinnable` for a program that has no saved form."""
    if prog.graph is None or prog.guard_plan is None:
        raise Unpinnable("a fallback program has no graph to save")
    if prog.containers:
        raise Unpinnable("the program writes back or returns an input object (no saved form)")
    if prog.attr_writes:
        raise Unpinnable("the program sets Python attributes of tensors (no saved form)")
    slots = []
    for s in prog.inputs:
        if s.source == "const":
            raise Unpinnable("the program reads a tensor that is neither input nor parameter")
        slots.append([s.source, s.ref])
    leaves = []
    for leaf in prog.out_leaves:
        ref = list(leaf.ref) if leaf.source == "graph" else leaf.ref
        leaves.append([leaf.source, encode(ref) if leaf.source == "value" else ref])
    try:
        plan = prog.guard_plan.to_json()
        graph = to_text(prog.graph)
        guard_keys = prog.guards.key_texts()
    except ValueError as exc:
        raise Unpinnable(str(exc)) from None
    return {
        "format": FORMAT,
        "graph": graph,
        "semantic_hash": prog.semantic_hash,
        "inputs": slots,
        "out_spec": encode(prog.out_spec),
        "out_leaves": leaves,
        "out_layouts": list(prog.out_layouts),
        "mutations": [list(m) for m in prog.mutations],
        "opaque_counts": dict(prog.opaque_counts),
        "opaque_reasons": dict(prog.opaque_reasons),
        "dynamic": prog.dynamic,
        "specialized": list(prog.specialized),
        "guard_plan": plan,
        "guard_keys": guard_keys,
    }


def program_from_doc(
    doc: dict[str, Any],
    spec: Any,
    leaves: Sequence[Any],
    paths: Sequence[str],
    ms: ModuleState | None = None,
    state: Sequence[torch.Tensor] = (),
) -> SnapshotProgram:
    """The program ``doc`` describes, guarded for this call; raises :class:`Unpinnable` when
    the call is not one it was captured for (its guards would differ) or it does not load."""
    if doc.get("format") != FORMAT:
        raise Unpinnable(f"program format {doc.get('format')!r}, expected {FORMAT!r}")
    plan = GuardPlan.from_json(doc["guard_plan"])
    try:
        consts = [s.ref for s in const_slots([InputSlot(a, b) for a, b in doc["inputs"]])]
        guards = build_guards(plan, spec, leaves, paths, ms, state, consts=consts)
        keys = guards.key_texts()
    except Exception as exc:  # NOTE: e.g. a new input aliasing another: capture says it best
        raise Unpinnable(f"the saved guards do not apply to this call ({exc})") from None
    if keys != doc["guard_keys"]:
        differ = next(
            (f"{a} / {b}" for a, b in zip(doc["guard_keys"], keys) if a != b),
            f"{len(doc['guard_keys'])} guards saved, {len(keys)} now",
        )
        raise Unpinnable(f"this call is not the captured one: {differ}")
    # NOTE: the key texts hold the outcomes capture saw (`x.shape[0] > 2: True`); the call at
    # hand must give them too, as a call that reuses a specialization must.
    env = GuardEnv(spec, leaves, None, state or (ms.fetch() if ms is not None else ()))
    if not guards.holds(env):
        failed = "; ".join(guards.explain(env)) or "a guard failed"
        raise Unpinnable(f"this call fails the captured guards: {failed}")
    out_leaves = [
        OutputLeaf(src, tuple(ref) if src == "graph" else decode(ref) if src == "value" else ref)
        for src, ref in doc["out_leaves"]
    ]
    return SnapshotProgram(
        doc["graph"],
        guards=guards,
        semantic_hash=doc["semantic_hash"],
        inputs=[InputSlot(src, ref) for src, ref in doc["inputs"]],
        out_spec=decode(doc["out_spec"]),
        out_leaves=out_leaves,
        out_layouts=[x if x in LAYOUTS else None for x in doc["out_layouts"]],
        mutations=[(i, o) for i, o in doc["mutations"]],
        opaque_counts=dict(doc["opaque_counts"]),
        opaque_reasons=dict(doc.get("opaque_reasons", {})),
        dynamic=doc["dynamic"],
        specialized=list(doc["specialized"]),
        guard_plan=plan,
    )

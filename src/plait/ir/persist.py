"""The optimized graph's saved form, and the blobs every saved stage reads.

:class:`Blobs` is what a stage restores itself from: named tensors built on stored bytes, and
``verified``, which returns once those bytes passed their integrity check (raising where they
did not). A stage may read the blobs' metadata (shapes, strides) at once; anything that reads
their *data* natively (a descriptor import, a kernel) calls ``verified()`` first.

:func:`graph_to_doc` records a graph as its IR text (an exact round trip) and the names of its
*live* constants (``const`` inputs the graph does not hold: each call binds them), with the
constants it holds as blobs; :func:`graph_from_doc` parses it back (without re-verifying: the
text came from a verified graph, in bytes checked against their hash) and puts the constants
back, refusing a document that does not match its blobs (:class:`GraphDocError`).

Example:
    >>> import torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((3,), torch.float32))
    >>> w = gb.input("w", TensorType((3,), torch.float32), kind="const")
    >>> gb.output(gb.call("mul", x, w))
    >>> graph = gb.build()
    >>> graph.constants["w"] = torch.ones(3)
    >>> doc, tensors = graph_to_doc(graph)
    >>> sorted(tensors), doc["live_constants"]
    (['w'], [])
    >>> graph_from_doc(doc, Blobs(tensors)).constants["w"].tolist()
    [1.0, 1.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.ir.graph import Graph
from plait.ir.parser import from_text
from plait.ir.text import to_text


@dataclass(frozen=True)
class Blobs:
    """Named tensors a saved stage restores itself from, and the gate that waits for their
    integrity check (``verified``; None: nothing to wait for, the data is already trusted)."""

    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    verified: Callable[[], object] | None = None


class GraphDocError(ValueError):
    """A saved graph document that does not restore the graph it records."""


def live_constants(graph: Graph) -> list[str]:
    """The graph's ``const`` inputs that it does not hold: tensors capture found outside the
    module state (a layer kept in a plain list, a tensor attribute, a closure's tensor), which
    each call binds from the capture's own slot. NOTE: their values are never saved (nor in a
    cache key): only the constants the graph holds (frozen parameters and buffers, and what was
    folded from them) are."""
    return sorted(
        v.name for v in graph.inputs if v.kind == "const" and v.name not in graph.constants
    )


def graph_to_doc(graph: Graph) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The graph's document (``graph``: its IR text, ``live_constants``) and its blobs (the
    constants it holds)."""
    doc = {"graph": to_text(graph), "live_constants": live_constants(graph)}
    tensors = {k: v for k, v in graph.constants.items() if isinstance(v, torch.Tensor)}
    return doc, tensors


def graph_from_doc(doc: Mapping[str, Any], blobs: Blobs) -> Graph:
    """The graph ``doc`` records, holding its constants from ``blobs`` (every ``const`` input
    but the live ones). Parse errors propagate as the parser raises them."""
    live = doc.get("live_constants", [])
    if not isinstance(live, list) or not all(isinstance(n, str) for n in live):
        raise GraphDocError("the saved graph's live constants are not a list of names")
    text = doc["graph"]
    if not isinstance(text, str):
        raise GraphDocError("the saved graph is not IR text")
    graph = from_text(text, verify=False)
    held = frozenset(live)
    for v in graph.inputs:
        if v.kind == "const" and v.name not in held:
            t = blobs.tensors.get(v.name)
            if t is None:
                raise GraphDocError(f"constant {v.name} is missing from the saved graph's blobs")
            graph.constants[v.name] = t
        elif v.name in held and v.kind != "const":
            raise GraphDocError(f"{v.name} is recorded as a live constant but is a {v.kind}")
    return graph

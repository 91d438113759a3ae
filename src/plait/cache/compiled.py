"""A compiled specialization as a cache entry: what is saved, and the warm start that loads it.

Saved: the optimized graph (IR text, exact round trip), its constants, the executor kind, the
Stax plan (extern layouts, the oneDNN calls refused at compile time) with the schedule and kernel
source hashes they must reproduce and the bytes of the weights it prepacked for oneDNN, the frozen
tensor names, and the manifest. Loaded: the graph is parsed back, the constants put back (built on
the store's mapping of the entry, no copy), and the Stax program rebuilt from the saved plan: no
pass runs, no extern runs on zeros, no weight is reordered again (oneDNN reads the saved bytes
where the mapping holds them), no oneDNN call is probed (the compile decided which ones oneDNN
accepts, under the same key: PyTorch's build, the CPU, the options), and the kernels come from
the kernel cache (content-addressed by their source; the C++ compiler runs only if that cache
lost them). A rebuilt program whose
schedule or kernels differ from the recorded ones is refused (:class:`StaleEntryError`): the
caller compiles afresh and replaces it.

Example:
    >>> import tempfile, torch
    >>> from plait.ir import GraphBuilder, TensorType
    >>> from plait.manifest import Manifest
    >>> from plait.cache import LocalStore
    >>> gb = GraphBuilder()
    >>> x = gb.input("x", TensorType((3,), torch.float32))
    >>> gb.output(gb.call("mul", x, 2.0))
    >>> store = LocalStore(tempfile.mkdtemp())
    >>> saved = SavedCompile(gb.build(), Manifest(source_hash="s"), "eager")
    >>> save_compiled(store, "ab" * 32, {"source": "s"}, saved)
    >>> load_compiled(store, "ab" * 32).executor
    'eager'
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.cache.artifact import pack_pieces, unpack
from plait.cache.store import Store
from plait.codegen import build
from plait.ir import Graph, TensorType
from plait.ir.persist import Blobs, GraphDocError, graph_from_doc, graph_to_doc
from plait.runtime.program_doc import ProgramDocError, program_from_doc, program_to_doc


class StaleEntryError(Exception):
    """An entry that loads but does not rebuild into the program it recorded."""


@dataclass
class SavedCompile:
    """What a compile produced that a warm start restores. ``manifest``: a
    :class:`~plait.manifest.Manifest` when saving, its JSON when loaded; ``executor``:
    ``"stax"`` or ``"eager"`` (the interpreter); ``program``: the StaxProgram, if any."""

    graph: Graph
    manifest: Any
    executor: str
    frozen: list[str] = field(default_factory=list)
    program: Any = None
    seconds: dict[str, float] = field(default_factory=dict)
    # NOTE: what the kernel cache reported while the load rebuilt the program (a library
    # discarded and rebuilt, ...): the lookup that takes the entry puts them in its manifest
    kernel_events: list[str] = field(default_factory=list)


def save_compiled(store: Store, key: str, parts: dict[str, Any], saved: SavedCompile) -> None:
    """Publish ``saved`` under ``key`` (its key ``parts`` go into the entry's meta, for
    explanations of later misses)."""
    # NOTE: each stage writes its own document and blobs; the entry only packs them
    doc, tensors = graph_to_doc(saved.graph)
    doc.update(executor=saved.executor, frozen=saved.frozen, manifest=saved.manifest.to_json())
    blobs: dict[str, torch.Tensor] = {}
    if saved.program is not None:
        doc["plan"], blobs = program_to_doc(saved.program)
    meta = {"parts": parts, "executor": saved.executor, "source": parts.get("source")}
    store.put(key, pack_pieces(doc, tensors, blobs), meta)


@dataclass
class LoadFailed:
    """What loading an entry ahead of its lookup raised: the lookup raises it as its own."""

    error: Exception


# NOTE: entries loaded ahead of the lookup that asks for them (a warm start's early run,
# plait.speculative_run), by store and key, or what loading one raised: each is handed out
# once, to that lookup, which reports an error as it reports its own
_AHEAD: dict[tuple[str, str], SavedCompile | LoadFailed] = {}


def hand_over(store: Store, key: str, loaded: SavedCompile | LoadFailed) -> None:
    """Give the next :func:`load_compiled` of ``key`` in ``store`` the entry ``loaded``
    (loaded and verified already), or make it raise what loading it raised;
    :func:`take_back` withdraws what no lookup took."""
    _AHEAD[(repr(store), key)] = loaded


def take_back(store: Store, key: str) -> SavedCompile | LoadFailed | None:
    return _AHEAD.pop((repr(store), key), None)


def load_compiled(store: Store, key: str) -> SavedCompile | None:
    """The entry under ``key`` rebuilt, or None when there is none. Raises
    :class:`~plait.cache.store.CorruptEntryError` (the store removed it) or
    :class:`StaleEntryError` (the caller removes it)."""
    ahead = take_back(store, key)
    if isinstance(ahead, LoadFailed):
        raise ahead.error
    if ahead is not None:
        return ahead
    start = time.perf_counter()
    first_event = len(build.EVENTS)
    # NOTE: a writable view (LocalStore: a private mapping of the entry): the constants are built
    # on it without a copy. Its hash is checked in the background while the Python parsers read
    # it, and waited for before anything native (a descriptor, a kernel) touches it.
    pending = store.get_pending(key)
    if pending is None:
        return None
    t_read = time.perf_counter()
    try:
        doc, tensors = unpack(pending.payload)
        # NOTE: every part of the document read here, before the hash check: a damaged one
        # fails in this block (reported as corruption when the hash fails), never later.
        executor, frozen, manifest = str(doc["executor"]), list(doc["frozen"]), doc["manifest"]
        plan = doc["plan"] if executor == "stax" else None
        if not isinstance(manifest, dict) or (executor == "stax" and not isinstance(plan, dict)):
            raise StaleEntryError("the entry's manifest or plan is not a JSON object")
        blobs = Blobs(tensors, pending.verified)
        # NOTE: no verifier run: to_text of a verified graph, in an entry checked against its
        # own hash and keyed by the plait version that wrote it.
        graph = graph_from_doc(doc, blobs)
    except Exception as exc:  # NOTE: parsers of unverified bytes may fail in any way
        pending.verified()  # NOTE: a corrupt entry is reported as corrupt, not as stale
        if isinstance(exc, StaleEntryError):
            raise
        if isinstance(exc, GraphDocError):
            raise StaleEntryError(str(exc)) from None
        raise StaleEntryError(f"entry does not load: {exc}") from None
    t_parse = time.perf_counter()
    program = None
    if _off_cpu(graph):
        # NOTE: a CUDA program binds its constants on the device when it is rebuilt (its CUDA
        # graph reads them): they are checked and copied there first
        pending.verified()
        _place(graph)
    if plan is not None:
        # NOTE: the rebuild reads the entry's constants as metadata only (shapes, strides): its
        # imports of prepacked weights wait for the check (import_deferred_packs), its reorders
        # (weights without a saved pack) wait for it in their threads, and so does the C++
        # compiler (kernels printed from the entry's graph). So the hash is checked during the
        # rebuild, and not waited for before it.
        try:
            program = _rebuild_stax(graph, plan, blobs)
        except Exception:
            pending.verified()
            raise
    t_rebuild = time.perf_counter()
    pending.verified()
    t_verified = time.perf_counter()
    _place(graph)
    if program is not None:
        program.import_deferred_packs()
    seconds = {
        "cache.read": t_read - start,
        "cache.parse": t_parse - t_read,
        "cache.rebuild": t_rebuild - t_parse + time.perf_counter() - t_verified,
        "cache.verify_wait": t_verified - t_rebuild,
    }
    events = build.EVENTS[first_event:]
    return SavedCompile(graph, manifest, executor, frozen, program, seconds, events)


def _off_cpu(graph: Graph) -> bool:
    return any(
        isinstance(v.type, TensorType) and v.type.device != "cpu"
        for v in graph.inputs
        if v.kind == "const" and v.name in graph.constants
    )


def _place(graph: Graph) -> None:
    """Constants of a graph on another device are copied there (after the hash check)."""
    for v in graph.inputs:
        held = v.kind == "const" and v.name in graph.constants  # NOTE: live ones are bound
        if held and isinstance(v.type, TensorType) and v.type.device != "cpu":
            t = graph.constants[v.name]
            if str(t.device) != v.type.device:
                graph.constants[v.name] = t.to(v.type.device)


def _rebuild_stax(graph: Graph, plan: dict[str, Any], blobs: Blobs) -> Any:
    """The Stax program rebuilt from its saved document (:func:`plait.runtime.program_doc.
    program_from_doc`); a document that does not rebuild the recorded program is stale."""
    try:
        return program_from_doc(graph, plan, blobs)
    except ProgramDocError as exc:
        raise StaleEntryError(str(exc)) from None

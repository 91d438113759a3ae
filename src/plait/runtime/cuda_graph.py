"""Whole-program CUDA graphs: a Stax program on CUDA captured once, replayed on every call.

At compile time the runner runs once on zero-filled static inputs (Triton compiles its kernels,
PyTorch creates its cuBLAS and cuDNN handles), then once more under capture. A call then checks
its inputs (dtype, shape, device: the graph reads raw memory), copies each into its static
buffer, replays the graph and returns fresh copies of the outputs: the next replay writes the
same buffers, so no output the caller holds is ever overwritten. An output that is the caller's
own input (or a bound constant) is returned as is, as the uncaptured runner returns it. A
training step's parameters and buffers, whose tensors the compile knows, are read where they
live from the first capture on (``resident``: no static copy is made or filled; a call that
passes one at other storage, a parameter given new ``.data``, runs kernel by kernel and
``cuda_graph["resident"]["moved"]`` counts it). Other inputs that a caller keeps at one
address call after call are read in place by a second capture, an output viewing a padded
buffer is copied out as that dense buffer, and an extern result only the return reads is
captured as PyTorch lays it out and copied out into the plan's layout (a padded product's real
columns: one copy, not two)
(:mod:`plait.runtime.cuda_graph_inputs`; ``cuda_graph["in_place"]`` counts the calls).

Not captured (the program runs its runner, kernel by kernel, and ``cuda_graph["reason"]`` says
why): ``StaxOptions(cuda_graphs=False)``; a fallback node (PyTorch's reference implementation may
sync with the host); symbolic sizes (a graph replays one size's grids and buffers); a node that
makes or reads a data-dependent size, or a runtime check (both
read values on the host); a non-tensor input (its value would be baked into the graph); an
output that is a view of an input; anything the capture itself refuses (its error is the reason).

Example (on a machine with CUDA)::

    program = compile_graph(graph)       # CUDA tensors: Triton kernels, one CUDA graph
    program.cuda_graph                   # {"used": True, "capture_s": ...}
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from plait.codegen.plan import ExternStep, FallbackStep
from plait.codegen.symbolic_shapes import is_symbolic
from plait.codegen.views import shape_of
from plait.errors import PlaitCompileError
from plait.ir.graph import Value
from plait.ir.types import TensorType
from plait.runtime.cuda_graph_inputs import (
    ALIGN_BYTES,
    Conformed,
    InPlaceGraph,
    InPlaceInputs,
    Key,
    copy_source,
    fresh_copies,
    key_of,
    moved,
    unowned,
)
from plait.runtime.cuda_handoff import (
    Handoff,
    Lease,
    Lent,
    StaleLeaseError,
    backward_keeps_graph,
    lent_values,
)
from plait.runtime.runner_calls import bad_input
from plait.runtime.runner_emit import returned_only

Call = Callable[..., list[Any]]


def why_not_captured(program: Any, enabled: bool) -> str | None:
    """Why ``program`` cannot be one CUDA graph, or None when it can be tried."""
    if not enabled:
        return "off (StaxOptions(cuda_graphs=False))"
    if is_symbolic(program.graph):
        # NOTE: a captured graph replays the buffers and grids of one size
        return "symbolic sizes: a CUDA graph replays the sizes it captured, not the call's"
    for step in program.plan.steps:
        if isinstance(step, FallbackStep):
            n = step.node
            return f"node {n.id} ({n.op}) falls back to PyTorch, which may sync with the host"
        if isinstance(step, ExternStep):
            n = step.node
            if n.op in ("aten_datadep", "aten_check") or any(
                isinstance(v.type, TensorType) and not v.type.is_static
                for v in (*n.outputs, *n.input_values())
            ):
                return f"node {n.id} ({n.op}) reads values on the host"
    graph = program.graph
    for v in graph.inputs:
        if not isinstance(v.type, TensorType) and not _bound(graph, v):
            return f"input %{v.name} is not a tensor (its value would be baked into the graph)"
    return None


def _bound(graph: Any, v: Any) -> bool:
    return v.kind == "const" and isinstance(graph.constants.get(v.name), torch.Tensor)


class GraphedCall:
    """The program's call through one captured CUDA graph (see the module docstring).

    ``borrowed``: input positions read in place from a forward graph's saved buffers (position
    -> index in ``handoff.buffers``; :mod:`plait.runtime.cuda_handoff`), never copied into."""

    def __init__(
        self,
        program: Any,
        fn: Call,
        borrowed: Mapping[int, int] | None = None,
        handoff: Handoff | None = None,
        resident: Mapping[int, torch.Tensor] | None = None,
        pool: Any = None,
        may_lend: bool = False,
    ) -> None:
        graph = program.graph
        # NOTE: the memory pool captured into: a lending forward's, for its backward (graphed)
        self.pool = pool
        # NOTE: per "copy" output position: the tensor owning its memory in the pool, kept only
        # while a backward may still borrow it (``may_lend``; release_outputs); the outputs the
        # calls read are unowned aliases (cuda_graph_inputs.unowned), so a later capture into
        # the pool takes that memory for its own temporaries and outputs
        self.may_lend = may_lend
        self.owned: dict[int, torch.Tensor] = {}
        self.fn = fn
        self.runner = program.runner
        self.device = program.device
        # NOTE: per output: the plan's strides for an extern result the runner returns raw
        # while captured (runner_emit.returned_only), copied out into them; None for the others
        raw = returned_only(program.plan)
        self.declared = [
            raw.get(id(o)) if isinstance(o, Value) else None for o in program.plan.graph.outputs
        ]
        self._lock = threading.Lock() if handoff is None else handoff.lock
        self.handoff = handoff
        self.borrowed = dict(borrowed or {})
        # NOTE: a lending forward's saved output positions, in ``handoff.buffers`` order
        self.lent: list[int] = []
        # NOTE: per input position: a static buffer the call copies into, or the bound constant
        self.statics: list[torch.Tensor] = []
        self.copies: list[tuple[int, torch.Tensor, TensorType]] = []
        # NOTE: per resident position: the address and strides the graph reads it at
        self.resident: dict[int, Key] = {}
        for i, v in enumerate(graph.inputs):
            if _bound(graph, v):
                self.statics.append(graph.constants[v.name])
                continue
            if i in self.borrowed:
                assert handoff is not None
                self.statics.append(handoff.buffers[self.borrowed[i]])
                continue
            t = v.type
            assert isinstance(t, TensorType)
            r = (resident or {}).get(i)
            key = key_of(r)
            if r is not None and key is not None and _resident_fits(r, t, self.device):
                self.statics.append(r)
                self.resident[i] = key
                continue
            static = torch.zeros(shape_of(t), dtype=t.dtype, device=self.device)
            self.statics.append(static)
            self.copies.append((i, static, t))
        self.names = [v.name for v in graph.inputs]
        self.types = [v.type for v in graph.inputs]
        self.graph = torch.cuda.CUDAGraph()
        self.outputs: list[tuple[str, Any]] = []
        # NOTE: what each call copies out (copy_source of each "copy" output, in order)
        self.sources: list[tuple[torch.Tensor, Any]] = []
        self.record: dict[str, Any] = {"used": True}
        if self.resident:
            # NOTE: "moved": calls run uncaptured because a resident input was elsewhere
            self.record["resident"] = {"inputs": len(self.resident), "moved": 0}
        # NOTE: the second capture that reads settled inputs in place (cuda_graph_inputs)
        self.in_place: InPlaceInputs | None = None

    def lend_through(self, handoff: Handoff, positions: list[int]) -> None:
        """From now on, the outputs at ``positions`` (``handoff.buffers``, in order) are lent
        to the caller (``Lent``), not copied out; each replay first vacates the buffers."""
        self._lock = handoff.lock
        self.handoff = handoff
        self.lent = list(positions)
        for p in positions:
            self.outputs[p] = ("lent", self.outputs[p][1])
        self.sources = self._sources(self.outputs)
        # NOTE: the backward's graph reads this graph's buffers: never captured again
        self.in_place = None
        self.record.pop("in_place", None)
        self.record["in_place_reason"] = (
            "lends its saved values to the backward's graph, captured on its buffers: copied"
        )

    def capture(self) -> None:
        """Warm up on a side stream, then capture; raises what the capture raises. The
        generators end where they started: the program's random ops draw at its calls (each
        replay advances the CUDA generator's offset by what the captured draws consume, as
        eager's calls do), never at compile time."""
        with keep_generators(self.device):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.fn(*self.statics)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            with (
                self.runner.returning_as_laid_out(),
                captured_into(self.graph, self.device, self.pool),
            ):
                outs = self.fn(*self.statics)
        classified = [self._classify(o, self.statics) for o in outs]
        del outs
        if self.may_lend:
            self.owned = {k: o for k, (kind, o) in enumerate(classified) if kind == "copy"}
        self.outputs = _unowned_copies(classified)
        del classified
        self.sources = self._sources(self.outputs)
        conformed = sum(isinstance(how, Conformed) for _, how in self.sources)
        if conformed:
            # NOTE: what the calls copy out of the graph into the plan's layout (and the
            # copy's Triton kernel compiled now, not at the first call)
            self.record["conformed_on_copy_out"] = conformed
            for _ in fresh_copies(self.sources, _copy_all):
                pass
        if self.copies:
            copied = [i for i, _, _ in self.copies]
            self.in_place = InPlaceInputs(self.record, copied, self.statics)

    def _capture_in_place(self, inputs: list[Any], pinned: dict[int, Any]) -> InPlaceGraph:
        """The program captured again on ``inputs`` (the caller's tensors at ``pinned``), into
        this graph's pool; runs no kernel (cuda_graph_inputs). Without grad mode, as the
        first capture ran on static buffers that require no grad."""
        graph = torch.cuda.CUDAGraph()
        pool = self.graph.pool()
        with (
            keep_generators(self.device),
            torch.no_grad(),
            self.runner.returning_as_laid_out(),
            captured_into(graph, self.device, pool),
        ):
            outs = self.fn(*inputs)
        outputs = _unowned_copies([self._classify(o, inputs) for o in outs])
        del outs
        return InPlaceGraph(graph, pinned, outputs, self._sources(outputs))

    def release_outputs(self, keep: set[int]) -> None:
        """Let go of the pool memory of the "copy" outputs not at ``keep`` (the positions a
        backward borrows): later captures into the pool may take it."""
        self.owned = {p: t for p, t in self.owned.items() if p in keep}
        self.may_lend = False

    def _sources(self, outputs: list[tuple[str, Any]]) -> list[tuple[torch.Tensor, Any]]:
        """What each call copies out for the ``copy`` outputs (cuda_graph_inputs.copy_source),
        in output order."""
        return [
            copy_source(o, self.declared[k])
            for k, (kind, o) in enumerate(outputs)
            if kind == "copy"
        ]

    def _classify(self, o: Any, inputs: list[Any]) -> tuple[str, Any]:
        if not isinstance(o, torch.Tensor):
            return "same", o
        for i, s in enumerate(inputs):
            if o is s:
                if any(i == j for j, _, _ in self.copies):
                    return "input", i
                # NOTE: a borrowed buffer is the forward's: the next forward overwrites it
                return ("copy", o) if i in self.borrowed else ("same", o)
        ptr = o.untyped_storage().data_ptr()
        held = [i for i, _, _ in self.copies] + list(self.resident)
        if any(ptr == inputs[i].untyped_storage().data_ptr() for i in held):
            raise PlaitCompileError("an output is a view of an input")
        return "copy", o

    def __call__(self, *args: Any) -> list[Any]:
        with self._lock:
            lease = self._take_borrowed(args) if self.borrowed else None
            if self.resident and moved(self.resident, args):
                return self._uncaptured(args, lease)
            for i, static, t in self.copies:
                _check(args[i], t, static, self.device, i, self.names[i])
            chosen = self.in_place.pick(args) if self.in_place is not None else None
            pinned = chosen.pinned if chosen is not None else {}
            targets = [s for i, s, _ in self.copies if i not in pinned]
            if targets:
                # NOTE: a few calls for every input (a training step's parameters and buffers:
                # hundreds), where a copy_ each cost the host more than the replay
                _copy_all(targets, [args[i] for i, _, _ in self.copies if i not in pinned])
            if self.lent:
                assert self.handoff is not None
                self.handoff.vacate()
            graph, outputs, sources = (
                (self.graph, self.outputs, self.sources)
                if chosen is None
                else (chosen.graph, chosen.outputs, chosen.sources)
            )
            graph.replay()
            copied = fresh_copies(sources, _copy_all)
            out: list[Any] = []
            for kind, o in outputs:
                if kind == "copy":
                    out.append(next(copied))
                elif kind == "input":
                    out.append(args[o])
                elif kind == "lent":
                    out.append(None)  # NOTE: filled below, with the lease
                else:
                    out.append(o)
            if self.lent:
                assert self.handoff is not None
                given = self.handoff.lend()
                for k, p in enumerate(self.lent):
                    out[p] = Lent(given, k)
            if lease is not None:
                assert self.handoff is not None
                self.handoff.returned(lease, backward_keeps_graph())
            if self.in_place is not None:
                self.in_place.after_call(args, chosen, self._capture_in_place)
            return out

    def _uncaptured(self, args: tuple[Any, ...], lease: Lease | None) -> list[Any]:
        """The call, kernel by kernel, where a resident input is not where the graph reads it
        (a parameter given new storage): the borrowed inputs read from the shared buffers, the
        lent outputs returned as plain tensors (a borrower copies those in)."""
        self.record["resident"]["moved"] += 1
        inputs = list(args)
        for i, k in self.borrowed.items():
            assert self.handoff is not None
            inputs[i] = self.handoff.buffers[k]
        for i, static, t in self.copies:
            _check(args[i], t, static, self.device, i, self.names[i])
        for i in self.resident:
            t = self.types[i]
            assert isinstance(t, TensorType)
            _check(args[i], t, self.statics[i], self.device, i, self.names[i])
        out = list(self.fn(*inputs))
        if lease is not None:
            assert self.handoff is not None
            self.handoff.returned(lease, backward_keeps_graph())
        return out

    def _take_borrowed(self, args: tuple[Any, ...]) -> Lease | None:
        """The borrowed inputs' values in the shared buffers: a lease's (``Lent`` arguments),
        or plain tensors copied in after the buffers' tenant is vacated."""
        handoff = self.handoff
        assert handoff is not None
        lease = lent_values(args, list(self.borrowed))
        if lease is not None:
            for i, k in self.borrowed.items():
                a = args[i]
                if not (isinstance(a, Lent) and a.lease is lease and a.index == k):
                    raise StaleLeaseError(
                        f"input {i} (%{self.names[i]}) is not the saved value the forward "
                        "lent for it"
                    )
            if lease.handoff is not handoff:
                raise StaleLeaseError("saved values lent by another program's forward")
            handoff.borrow(lease)
            return lease
        handoff.vacate()
        for i, k in self.borrowed.items():
            t = self.types[i]
            assert isinstance(t, TensorType)
            _check(args[i], t, handoff.buffers[k], self.device, i, self.names[i])
            handoff.buffers[k].copy_(args[i])
        return None


def _resident_fits(r: Any, t: TensorType, device: torch.device) -> bool:
    """Whether the graph can read ``r`` where it lives for an input of type ``t``: the dense
    layout the kernels were planned for (a static buffer's), 16-byte aligned (Triton
    specializes on the alignment it compiled for)."""
    return (
        isinstance(r, torch.Tensor)
        and r.device == device
        and r.dtype == t.dtype
        and tuple(r.shape) == tuple(shape_of(t))
        and r.is_contiguous()
        and r.data_ptr() % ALIGN_BYTES == 0
        and r.data_ptr() != 0
    )


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``t.copy_(s)`` for each pair, as one ``_foreach_copy_`` per dtype and layout: a list of
    one dtype and dense layout takes its multi-tensor kernels (a few launches in all), a mixed
    one a launch per tensor. NOTE: targets are distinct buffers that no source overlaps."""
    groups: dict[tuple[torch.dtype, bool], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for t, s in zip(targets, sources):
        group = groups.setdefault((t.dtype, s.is_contiguous()), ([], []))
        group[0].append(t)
        group[1].append(s)
    for ts, ss in groups.values():
        torch._foreach_copy_(ts, ss)


def _check(a: Any, t: TensorType, static: torch.Tensor, device: Any, i: int, name: str) -> None:
    if (
        not isinstance(a, torch.Tensor)
        or a.dtype != t.dtype
        or a.shape != static.shape
        or a.device != device
    ):
        bad_input(i, name, str(t), a)


@contextlib.contextmanager
def captured_into(graph: Any, device: torch.device, pool: Any = None) -> Iterator[None]:
    """``torch.cuda.graph(graph, pool=pool)``, whose failure leaves the CUDA generators usable.

    NOTE: PyTorch's capture_end raises on a failed capture before it runs the generators'
    capture epilogue, so they stay in capture mode and every later random draw outside a
    capture raises ("Offset increment outside graph capture"). A complete throwaway capture
    (prologue and epilogue) ends that state; the failure is then raised as it was."""
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    except BaseException:
        spare = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.graph(spare):
            torch.zeros(1, device=device)  # NOTE: one kernel (capturing none warns)
        spare.reset()
        raise


@contextlib.contextmanager
def keep_generators(device: torch.device) -> Iterator[None]:
    """The CPU generator and ``device``'s CUDA generator restored on exit: compile-time runs
    (a warm-up, a capture) draw nothing from the user's random stream."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device)
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        torch.cuda.set_rng_state(cuda, device)


def graphed(
    program: Any,
    fn: Call,
    enabled: bool,
    borrow_from: tuple[Any, Mapping[int, int]] | None = None,
    resident: Mapping[int, torch.Tensor] | None = None,
    share_pool: bool = True,
    may_lend: bool = False,
) -> tuple[Call, dict[str, Any]]:
    """``program``'s call on CUDA: through one CUDA graph where it can be captured, else ``fn``
    (after a warm-up run that compiles its kernels); with the record of what happened.

    ``borrow_from``: ``(forward program, {input position: its output position})``, a training
    step's backward and where its saved inputs come from: those the forward's graph writes into
    buffers of the right type are read there in place (:mod:`plait.runtime.cuda_handoff`).
    ``resident``: the caller's tensors for some input positions (a module's parameters), read
    where they live from the first capture on; a call that passes one elsewhere runs
    uncaptured. ``share_pool``: a linked backward is captured into the forward graph's pool.
    ``may_lend``: a training step's forward, whose outputs a backward may borrow: it keeps their
    memory until the backward is linked, which lets go of the others (release_outputs).

    NOTE: sharing is safe by the calls' order: every graph output is copied out or lent under
    the handoff's lock before another replay, the lent buffers stay allocated for the forward
    graph's life (never free at the backward's capture), so what the two graphs share is memory
    that neither holds between its replays."""
    reason = why_not_captured(program, enabled)
    start = time.perf_counter()
    lender = borrow_from[0]._call if borrow_from is not None else None
    link = None
    if reason is None and borrow_from is not None:
        link = _link(program, *borrow_from)
    if isinstance(lender, GraphedCall) and lender.may_lend:
        lender.release_outputs(set(link[2]) if link is not None else set())
    if reason is None:
        borrowed, handoff = (link[0], link[1]) if link is not None else (None, None)
        pool = lender.graph.pool() if link is not None and lender and share_pool else None
        call = GraphedCall(program, fn, borrowed, handoff, resident, pool, may_lend)
        try:
            call.capture()
        except RuntimeError as exc:
            reason = f"the capture failed: {str(exc).splitlines()[0]}"
        else:
            record = call.record
            if link is not None and borrow_from is not None:
                forward, positions = borrow_from[0], link[2]
                forward._call.lend_through(link[1], positions)
                handed = {
                    "values": len(positions),
                    "bytes": sum(b.numel() * b.element_size() for b in link[1].buffers),
                }
                forward.cuda_graph["lends"] = handed
                record["borrows"] = handed
                record["pool"] = "the forward's" if pool is not None else "its own"
            record["capture_s"] = round(time.perf_counter() - start, 6)
            return call, record
    warm_up(program, fn)
    return fn, {"used": False, "reason": reason}


def _link(
    program: Any, forward: Any, sources: Mapping[int, int]
) -> tuple[dict[int, int], Handoff, list[int]] | None:
    """The backward inputs read in place from ``forward``'s graph: those whose source output
    the forward's graph writes into its pool (not an input or constant) contiguous and of the
    input's dtype and shape (the backward's kernels read their planned layout). Returns the
    borrowed positions (-> buffer index), the handoff, and the lent output positions."""
    lender = forward._call
    if not isinstance(lender, GraphedCall) or lender.lent or not lender.may_lend:
        return None
    borrowed: dict[int, int] = {}
    positions: list[int] = []
    buffers: list[torch.Tensor] = []
    for i, p in sorted(sources.items()):
        kind, o = lender.outputs[p][0], lender.owned.get(p)
        t = program.graph.inputs[i].type
        if (
            kind != "copy"
            or not isinstance(t, TensorType)
            or not isinstance(o, torch.Tensor)
            or not o.is_contiguous()
            or o.dtype != t.dtype
            or tuple(o.shape) != shape_of(t)
            or o.device != program.device
        ):
            continue
        if p not in positions:
            positions.append(p)
            buffers.append(o)
        borrowed[i] = positions.index(p)
    if not borrowed:
        return None
    return borrowed, Handoff(buffers), positions


def _unowned_copies(outputs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``outputs`` with each "copy" output an unowned alias of its memory in the pool."""
    return [(kind, unowned(o)) if kind == "copy" else (kind, o) for kind, o in outputs]


def warm_up(program: Any, fn: Call) -> None:
    """Run ``fn`` once on zero-filled inputs, so that its kernels compile now, not at the
    first call. Skipped when an input is not a tensor."""
    graph = program.graph
    args = []
    for v in graph.inputs:
        if _bound(graph, v):
            args.append(graph.constants[v.name])
        elif isinstance(v.type, TensorType) and v.type.is_static:
            args.append(torch.zeros(shape_of(v.type), dtype=v.type.dtype, device=program.device))
        else:
            return
    try:
        with keep_generators(program.device):
            fn(*args)
            torch.cuda.synchronize(program.device)
    except RuntimeError:
        return  # NOTE: a runtime check may refuse zeros; the kernels then compile at first call

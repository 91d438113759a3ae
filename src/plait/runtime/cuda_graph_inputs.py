"""A graphed program's inputs read where the caller keeps them, and its outputs copied out.

A CUDA graph reads raw addresses: :class:`plait.runtime.cuda_graph.GraphedCall` captures the
program at compile time on private static buffers and copies every input into them at each
call (a training step's backward: all the parameters it reads, and the cotangent of the logits,
the largest tensor of the step). Yet a caller passes most inputs at the same address call after
call: parameters and buffers (optimizers update them in place), and often the rest (the caching
allocator hands a step's tensors the addresses it handed the last step's).

:class:`InPlaceGraph` is a second capture of the program that reads such inputs in place. After
a call whose inputs at some positions have the address and strides they had at the previous
call (and the layout of the static buffer: the kernels were built for it), the program is
captured again with those positions reading the caller's tensors ("pinned"), the others the
static buffers, into the memory pool of the first graph. A later call whose pinned inputs are at
the captured addresses, with the captured strides, replays it and copies only the others; any
other call replays the first graph on copies, as before. Inputs that settle later (a training
step's first call runs among the compile's allocations: an address then may not be the one an
input keeps) are pinned by another capture; after a call that moved a pinned input, the inputs
still in place are pinned at once; a new set settled after moves, again after two calls: at most
``MAX_CAPTURES`` captures in all. Every in-place graph is kept, and a call replays, of those
whose pinned inputs are all where they were captured, the one pinning the most: an input that
moves back and forth (a training step's cotangent, where other work allocates between the
steps) leaves the others read in place (on an H200, GPT-2's backward, when only the latest
graph was kept: 7 of 15 calls in place, every input copied once its three captures were
spent). No graph holds its copied-out outputs: each reads them through an unowned alias
(:func:`unowned`), so a later capture into the pool reuses that memory, as it reuses every
graph's temporaries (on an H100, GPT-2's training step held 3191 MiB between steps with three
in-place backward graphs owning their gradients, 1504 MiB without). Never a wrong answer: an
in-place graph only runs when each pinned address holds the caller's own tensor of the captured
layout.

Invariants:

- The capture runs no kernel: the warm-up (on the private buffers, at compile time) made the
  first graph; the in-place capture only records, so a program that wrote into an input would
  still not touch a caller's tensor before its call.
- All graphs share one pool and replay under the program's lock, one at a time; each replay's
  copied outputs are copied out before the lock is released, so a later replay of another
  graph writing the same memory reaches no result the caller holds. What stays allocated in the
  pool is what must outlive a replay: a lending forward's saved buffers (owned until the
  backward links, then by the handoff).
- A program that lends its saved values to a backward graph (:mod:`plait.runtime.cuda_handoff`)
  is never captured again: the backward graph reads the first graph's buffers.
- Pinned addresses are 16-byte aligned (Triton kernels are specialized on their pointers'
  alignment when they are compiled, at the warm-up on the aligned static buffers).

Outputs are copied out of the graph after each replay (:func:`fresh_copies`): most by
multi-tensor copies; one that views a contiguous buffer hardly larger than it as its whole
buffer (a dense copy), then viewed; and an extern result that the runner returned as PyTorch
laid it out while captured (``runner_emit.returned_only``: a padded product's real columns,
which the runner would otherwise have copied into the plan's layout inside the graph) into the
plan's layout (:func:`conformed_copy`).

``record`` (the program's ``cuda_graph`` entry) says what happened: ``in_place`` with the
number of pinned inputs and of calls that replayed each graph, or ``in_place_reason``;
``conformed_on_copy_out``, the outputs copied into the plan's layout.

Example (the bookkeeping, on CPU tensors)::

    >>> import torch
    >>> a = torch.zeros(4)
    >>> key_of(a) == key_of(a), key_of(a) == key_of(torch.zeros(4).t())
    (True, False)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from plait.errors import PlaitCompileError

# NOTE: at most this many in-place captures per program (each after inputs settled: the first,
# one that pins inputs that settled later, one after a move)
MAX_CAPTURES = 3
ALIGN_BYTES = 16
Key = tuple[int, tuple[int, ...]]


def key_of(a: Any) -> Key | None:
    """Where a tensor's elements are: its address and strides (None for a non-tensor)."""
    if not isinstance(a, torch.Tensor):
        return None
    return (a.data_ptr(), tuple(a.stride()))


class InPlaceGraph:
    """The program captured with the inputs at ``pinned`` (position -> the caller's address
    and strides at the capture) read in place; ``outputs`` classified as the first graph's,
    ``sources`` what a call copies out (:func:`copy_source`)."""

    def __init__(
        self,
        graph: Any,
        pinned: dict[int, Key],
        outputs: list[tuple[str, Any]],
        sources: list[tuple[torch.Tensor, Any]],
    ) -> None:
        self.graph = graph
        self.pinned = pinned
        self.outputs = outputs
        self.sources = sources


class InPlaceInputs:
    """Decides, call after call, which inputs a graphed program reads in place (module
    docstring); ``copied``: the positions that are copied into ``statics`` otherwise."""

    def __init__(self, record: dict[str, Any], copied: Sequence[int], statics: Sequence[Any]):
        self.record = record
        self.copied = list(copied)
        self.statics = list(statics)
        # NOTE: the in-place graphs captured, oldest first
        self.graphs: list[InPlaceGraph] = []
        self.last: list[Key | None] | None = None
        # NOTE: after a call of an in-place graph: that graph, and the addresses of the inputs
        # it copies
        self.last_free: tuple[InPlaceGraph, dict[int, Key | None]] | None = None
        self.captures = 0
        self.calls = {"in_place": 0, "copied": 0}
        self.reason: str | None = None
        self._write()

    def pick(self, args: Sequence[Any]) -> InPlaceGraph | None:
        """Of the in-place graphs whose pinned inputs are all where they were captured, the one
        pinning the most (the latest of those); None where none is (copy every input)."""
        best = None
        for graph in reversed(self.graphs):
            if (best is None or len(graph.pinned) > len(best.pinned)) and not moved(
                graph.pinned, args
            ):
                best = graph
        self.calls["in_place" if best is not None else "copied"] += 1
        return best

    def after_call(
        self, args: Sequence[Any], used: InPlaceGraph | None, capture: Callable[..., Any]
    ) -> None:
        """After a call: capture (again) where inputs settled at new addresses, where inputs
        the in-place graph copies settled since it was captured, or, after a call that no graph
        matched, with the pinned inputs of a graph that are still in place (the others moved).
        ``capture``: ``(inputs, pinned positions) -> InPlaceGraph``; raises what the capture
        raises."""
        if self.reason is not None:
            return
        if used is not None:
            self.last = None  # NOTE: a later move is judged from two calls after it
            if self.captures < MAX_CAPTURES:
                self._widen(args, used, capture)
            return
        self.last_free = None
        keys = [key_of(args[i]) for i in self.copied]
        last, self.last = self.last, keys
        stayed = max(
            ({i: k for i, k in g.pinned.items() if key_of(args[i]) == k} for g in self.graphs),
            key=len,
            default={},
        )
        if stayed and self.captures < MAX_CAPTURES:
            # NOTE: inputs read in place call after call, where others moved: read in place
            # still (no graph pins just them, or it would have matched)
            self.last = None
            self._capture(args, stayed, capture)
            return
        if last is None:
            return
        if self.captures >= MAX_CAPTURES:
            self.reason = (
                f"inputs moved after {self.captures} in-place captures: a call that none of "
                "the in-place graphs matches copies every input"
            )
            self._write()
            return
        pinned = {
            i: k
            for i, k, before in zip(self.copied, keys, last)
            if k is not None and k == before and _fits(args[i], self.statics[i])
        }
        if pinned:
            self._capture(args, pinned, capture)

    def _widen(self, args: Sequence[Any], used: InPlaceGraph, capture: Callable[..., Any]) -> None:
        free = {i: key_of(args[i]) for i in self.copied if i not in used.pinned}
        before, self.last_free = self.last_free, (used, free)
        if before is None or before[0] is not used:
            return  # NOTE: settled means two calls of one graph at one address
        settled = {
            i: k
            for i, k in free.items()
            if k is not None and before[1].get(i) == k and _fits(args[i], self.statics[i])
        }
        if settled:
            self._capture(args, {**used.pinned, **settled}, capture)

    def _capture(
        self, args: Sequence[Any], pinned: dict[int, Key], capture: Callable[..., Any]
    ) -> None:
        """Capture with ``pinned`` read in place, kept beside the earlier ones; a refused
        capture keeps the graphs there were (or none) and is recorded, never tried again."""
        inputs = [args[i] if i in pinned else s for i, s in enumerate(self.statics)]
        start = time.perf_counter()
        self.captures += 1
        self.last_free = None
        try:
            self.graphs.append(capture(inputs, pinned))
        except (RuntimeError, PlaitCompileError) as exc:
            self.reason = f"the in-place capture failed: {str(exc).splitlines()[0]}"
        else:
            self.record["in_place_capture_s"] = round(time.perf_counter() - start, 6)
        self._write()

    def _write(self) -> None:
        if self.reason is not None:
            self.record["in_place_reason"] = self.reason
        self.record["in_place"] = {
            # NOTE: of the graph pinning the most
            "pinned": max((len(g.pinned) for g in self.graphs), default=0),
            "of": len(self.copied),
            "captures": self.captures,
            "graphs": len(self.graphs),
            "calls": self.calls,  # NOTE: the live counts (the record is read after the calls)
        }


def unowned(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory that does not keep it allocated: a graph's output, read
    after each replay (copied out under the program's lock) while the pool may lend its memory
    to a later capture, whose replays run one at a time with this graph's. ``t`` itself where
    PyTorch lacks the unowned storage (then the memory stays the graph's).

    Example:
        >>> a = torch.arange(6.0)
        >>> b = unowned(a)
        >>> (b.data_ptr() == a.data_ptr(), b.tolist() == a.tolist())
        (True, True)
    """
    make = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if make is None:
        return t
    storage = t.untyped_storage()
    alias = make(storage.data_ptr(), t.device, storage.nbytes())
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    return out.set_(alias, t.storage_offset(), t.shape, t.stride())


def moved(pinned: dict[int, Key], args: Sequence[Any]) -> bool:
    """Whether an input at ``pinned`` is not at the address and strides recorded for it."""
    return any(key_of(args[i]) != k for i, k in pinned.items())


def _fits(a: torch.Tensor, static: Any) -> bool:
    """Whether ``a`` can stand where the graph read ``static``: its layout, aligned."""
    return (
        isinstance(static, torch.Tensor)
        and a.data_ptr() % ALIGN_BYTES == 0
        and a.data_ptr() != 0
        and a.dtype == static.dtype
        and a.shape == static.shape
        and a.device == static.device
        and a.stride() == static.stride()
    )


class Conformed:
    """How a call copies out an output the runner returned as PyTorch laid it out: into a
    tensor of the plan's ``strides`` (:func:`conformed_copy`)."""

    __slots__ = ("strides",)

    def __init__(self, strides: tuple[int, ...]) -> None:
        self.strides = strides


def copy_source(o: torch.Tensor, declared: tuple[int, ...] | None) -> tuple[torch.Tensor, Any]:
    """What a call copies out for output ``o``, and how: ``declared`` is the plan's strides
    for an output the runner returned as PyTorch laid it out (``runner_emit.returned_only``;
    None for the others). Where ``o`` has other strides it is copied into them
    (:class:`Conformed`); else as :func:`dense_source` says."""
    if declared is not None and tuple(o.stride()) != declared:
        return o, Conformed(declared)
    return dense_source(o)


def conformed_copy(o: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """A copy of ``o`` laid out in ``strides``: on CUDA, the real columns of a padded product
    (rows of a wider buffer) into a contiguous tensor by a Triton kernel
    (:mod:`plait.codegen.cuda_row_copy`: at a dense copy's bandwidth, where ATen's strided copy
    runs at half of it), else by ATen's copy."""
    out = torch.empty_strided(o.shape, strides, dtype=o.dtype, device=o.device)
    if o.is_cuda and out.is_contiguous():
        from plait.codegen.cuda_row_copy import copy_rows

        if copy_rows(o, out):
            return out
    out.copy_(o)
    return out


def dense_source(o: torch.Tensor) -> tuple[torch.Tensor, tuple[Any, ...] | None]:
    """What to copy out for an output ``o``: ``(o, None)``, or, when ``o`` is a strided view
    of a contiguous buffer hardly larger than it (the real columns of a padded product), the
    buffer and how to view its copy as ``o`` (size, stride, offset): a dense copy runs at full
    bandwidth, a strided one at half (an H200, GPT-2's logits: 489 us)."""
    base = o._base
    if o.is_contiguous() or base is None or not base.is_contiguous():
        return o, None
    if base.numel() * 8 > o.numel() * 9:  # NOTE: at most an eighth more than the view
        return o, None
    offset = o.storage_offset() - base.storage_offset()
    return base, (tuple(o.shape), tuple(o.stride()), offset)


def fresh_copies(
    sources: list[tuple[torch.Tensor, Any]],
    copy_all: Callable[[list[torch.Tensor], list[torch.Tensor]], None],
) -> Iterator[torch.Tensor]:
    """Copies of the outputs ``sources`` (from :func:`copy_source`): each laid out as
    ``clone`` lays it out, or as the same view of a copy of its dense buffer (those filled by
    one call of ``copy_all``), or in the plan's strides (:func:`conformed_copy`)."""
    if not sources:
        return iter(())
    buffers = [b for b, how in sources if not isinstance(how, Conformed)]
    fresh = [torch.empty_like(b) for b in buffers]
    if buffers:
        copy_all(fresh, buffers)
    dense = iter(fresh)
    out = []
    for b, how in sources:
        if isinstance(how, Conformed):
            out.append(conformed_copy(b, how.strides))
            continue
        f = next(dense)
        out.append(f if how is None else f.as_strided(how[0], how[1], f.storage_offset() + how[2]))
    return iter(out)

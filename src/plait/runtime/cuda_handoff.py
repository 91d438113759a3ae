"""The saved values of a training step handed from the forward's CUDA graph to the backward's
in place.

A graphed forward writes each saved value into a buffer of its graph's pool; the backward's
graph is captured reading those same buffers as its inputs. A forward call lends the buffers to
the step that made them (a :class:`Lease`; each saved position of the call's result is a
:class:`Lent` of it) instead of copying them out, and the backward of that step replays without
copying them in: no copy on the common path (forward, backward, forward, backward...).

Invariant: the buffers hold at most one lease's values, the tenant's. Whatever would write them
(the next forward replay, a backward of another step, a plain tensor passed in their place)
first vacates the tenant: a lease still needed (its backward has not run, or ran with
``retain_graph=True``) gets private copies of its values, so two forwards before a backward
(gradient accumulation over micro-batches), or a second backward, read what their step saved. A
backward run on a lease whose values are private copies copies them into the buffers first.

Example (the protocol on CPU tensors; on CUDA, :mod:`plait.runtime.cuda_graph` drives it)::

    >>> import torch
    >>> buffers = [torch.zeros(2)]
    >>> handoff = Handoff(buffers)
    >>> _ = buffers[0].fill_(1.0); first = handoff.lend()      # step 1's forward
    >>> handoff.vacate(); _ = buffers[0].fill_(2.0); second = handoff.lend()  # step 2's
    >>> handoff.borrow(first); buffers[0].tolist()           # step 1's backward
    [1.0, 1.0]
    >>> handoff.borrow(second); buffers[0].tolist()          # step 2's: its private copy
    [2.0, 2.0]
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from plait.errors import PlaitCompileError

# NOTE: whether the running backward keeps its graph (retain_graph); where PyTorch lacks the
# query, a lease stays needed until it is dropped (copies on the next forward: correct, slower)
_KEEP_GRAPH = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)


def backward_keeps_graph() -> bool:
    return True if _KEEP_GRAPH is None else bool(_KEEP_GRAPH())


class Lease:
    """One forward call's saved values: the shared buffers while it is their tenant, else
    private copies (or nothing, once its backward ran for the last time)."""

    __slots__ = ("__weakref__", "done", "handoff", "values")

    def __init__(self, handoff: Handoff) -> None:
        self.handoff = handoff
        self.values: list[torch.Tensor] | None = None  # NOTE: None: in the buffers
        self.done = False


class Lent:
    """A saved position of a lending forward's result: the ``index``-th value of ``lease``."""

    __slots__ = ("index", "lease")

    def __init__(self, lease: Lease, index: int) -> None:
        self.lease = lease
        self.index = index

    def __repr__(self) -> str:
        return f"Lent(value {self.index} of a forward's saved buffers)"


class StaleLeaseError(PlaitCompileError):
    """A backward through a step whose saved values were released, or given saved values of
    two forward calls."""

    error_code = "PLAIT-C123"


class Handoff:
    """The buffers shared by a forward graph's saved outputs and a backward graph's inputs, and
    their tenant. Both programs' calls hold :attr:`lock` (they replay over the same memory)."""

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        self.buffers = list(buffers)
        self.lock = threading.Lock()
        self._tenant: weakref.ref[Lease] | None = None
        self.stashes = 0  # NOTE: private copies made (a forward or backward out of order)

    def tenant(self) -> Lease | None:
        return None if self._tenant is None else self._tenant()

    def vacate(self) -> None:
        """Before anything writes the buffers: the tenant, if still needed, keeps copies."""
        lease = self.tenant()
        self._tenant = None
        if lease is not None and not lease.done and lease.values is None:
            lease.values = [b.clone() for b in self.buffers]
            self.stashes += 1

    def lend(self) -> Lease:
        """After a forward wrote the buffers: a lease of them to that call."""
        lease = Lease(self)
        self._tenant = weakref.ref(lease)
        return lease

    def borrow(self, lease: Lease) -> None:
        """Before a backward reads the buffers: ``lease``'s values in them."""
        if lease.done:
            raise StaleLeaseError(
                "a compiled backward ran a second time through a step whose saved values it "
                "released: call backward with retain_graph=True to run it again"
            )
        if self.tenant() is lease:
            return
        assert lease.values is not None  # NOTE: not the tenant, so vacated with copies
        self.vacate()
        for buffer, value in zip(self.buffers, lease.values):
            buffer.copy_(value)

    def returned(self, lease: Lease, keep: bool) -> None:
        """After a backward: unless its graph is kept, ``lease`` is needed no more."""
        if not keep:
            lease.done = True
            lease.values = None


def lent_values(args: Sequence[Any], positions: Sequence[int]) -> Lease | None:
    """The one lease the ``Lent`` arguments at ``positions`` come from (None when none is)."""
    leases = {id(a.lease): a.lease for p in positions for a in [args[p]] if isinstance(a, Lent)}
    if len(leases) > 1:
        raise StaleLeaseError("a backward's saved values come from two different forward calls")
    return next(iter(leases.values()), None)


def claimed(values: Sequence[Any]) -> list[Any]:
    """``values`` with each ``Lent`` replaced by a tensor of its own (a copy of the shared
    buffer, or the private copy), its lease then released: for a consumer other than the linked
    backward graph (a backward split into segments reads the saved values itself)."""
    out = []
    leases = []
    for v in values:
        if isinstance(v, Lent):
            lease = v.lease
            held = lease.values
            out.append(lease.handoff.buffers[v.index].clone() if held is None else held[v.index])
            leases.append(lease)
        else:
            out.append(v)
    for lease in leases:
        lease.done = True
        lease.values = None
    return out

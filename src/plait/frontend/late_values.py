"""Values a capture that skips arithmetic left uncomputed, computed when the program reads them.

A capture with ``arithmetic="skip"`` leaves the heaviest calls uncomputed
(:mod:`plait.frontend.unsampled`); a read of their values (``bool(y.sum() > 0)`` after a
``linear``, a ``sort``) used to capture again computing every call, running the program's
Python a second time: its side effects (``self.calls += 1``) happened twice in that call. Where
the capture may continue the call eagerly (``capture_program(..., continuation=True)``, as
``plait.compile`` captures: :mod:`plait.frontend.continuation`), :class:`Replay`
records, in program order, each call left uncomputed and each call that ran on uncomputed
values, and at such a read runs them again for real on the samples (the same kernels on the
same operands: eager's values), so that capture goes on with every value computed and the
Python runs once.

NOTE: invariants. Replayed in recording order, each call sees its operands as they were when it
ran: an operand it read computed must be unchanged since (its ``_version``, and no write to its
storage: one through ``.data`` keeps a version of its own), and every write to
an uncomputed tensor is itself a recorded call. Not replayed (the capture computes every call
again, as before): a call that wrote uncomputed values into a computed tensor (its earlier
values are gone), a capture whose random number generator moved (a draw would not repeat), a
call run under autocast, and a log past :data:`LIMIT` bytes of results (each is kept alive until
the read: a whole forward's activations).

Example:
    >>> import torch
    >>> import torch.nn.functional as F
    >>> replay, out = Replay(), torch.empty(2, 3)
    >>> x, w = torch.ones(2, 4), torch.ones(3, 4)
    >>> replay.skipped(F.linear, (x, w), {}, out, [x, w], fresh=True)
    >>> replay.compute(moved=False) is None and out.sum().item()
    24.0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from plait.frontend.views import storage_id, tensors_in

if TYPE_CHECKING:
    from plait.frontend.tracer import CaptureContext

LIMIT = 64 << 20  # NOTE: bytes of recorded results held until a read computes them


@dataclass
class _Call:
    func: Callable[..., Any]
    pargs: Any
    pkwargs: dict
    fresh: list[tuple[int, torch.Tensor]]  # NOTE: (position among its results, the result)
    computed: list[tuple[torch.Tensor, int]]  # NOTE: operands read computed, with _version


class Replay:
    """The calls to run again where the program reads uncomputed values (see the module doc)."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self.held = 0
        self.skips = 0  # NOTE: calls left uncomputed among them
        self.broken: str | None = None
        self.read: set[int] = set()  # NOTE: the storages recorded calls read computed

    def _record(self, call: _Call) -> None:
        if self.broken is not None:
            return
        self.held += sum(t.untyped_storage().nbytes() for _, t in call.fresh)
        if self.held > LIMIT:
            self.stop(f"the calls left uncomputed hold more than {LIMIT >> 20} MiB of results")
            return
        self.calls.append(call)
        self.read.update(storage_id(t) for t, _ in call.computed)

    def stop(self, why: str) -> None:
        """Nothing is replayed from now on (``why``: the reason a read resamples)."""
        self.broken = self.broken or why
        self.calls.clear()
        self.read.clear()

    def skipped(
        self, func: Any, pargs: Any, pkwargs: dict, out: torch.Tensor, computed: list[Any], *,
        fresh: bool,
    ) -> None:  # fmt: skip
        """A call left uncomputed: its result ``out`` (``fresh``), or its target written in
        place; ``computed``: its operands that hold computed values."""
        self.skips += 1
        kept = [(t, t._version) for t in computed]
        self._record(_Call(func, pargs, pkwargs, [(0, out)] if fresh else [], kept))

    def wrote(self, t: torch.Tensor) -> None:
        """The program wrote ``t`` in place: a recorded call that read its storage computed
        would read the new values (a write through ``.data`` bumps no version it kept)."""
        if storage_id(t) in self.read:
            self.stop("a call left uncomputed reads a tensor written since")

    def ran(
        self,
        func: Any,
        pargs: Any,
        pkwargs: dict,
        out: Any,
        operands: list[torch.Tensor],
        computed: list[bool],
        versions: list[int],
    ) -> None:
        """A call that ran on uncomputed values (``computed``: which operands were not);
        ``versions``: the operands' before it ran."""
        kept = []
        for t, ok, v in zip(operands, computed, versions):
            if ok and t._version != v:
                self.stop(f"{getattr(func, '__name__', func)} wrote a computed tensor with "
                          "values capture did not compute")  # fmt: skip
                return
            if ok:
                kept.append((t, v))
        if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
            self.stop("a call ran on values capture did not compute under autocast")
            return
        owned = {storage_id(t) for t in operands}
        fresh = [(i, t) for i, t in enumerate(tensors_in(out)) if storage_id(t) not in owned]
        self._record(_Call(func, pargs, pkwargs, fresh, kept))

    def compute(self, moved: bool) -> str | None:
        """Run the recorded calls again for real: None once every one has, else why not
        (``moved``: the random number generator moved during the capture)."""
        if self.broken is not None:
            return self.broken
        if moved:
            return "the random number generator moved while capture skipped arithmetic"
        for call in self.calls:
            if any(t._version != v for t, v in call.computed):
                return f"{getattr(call.func, '__name__', call.func)} reads a tensor written since"
        if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
            return "the program reads them under autocast"
        with torch._C.DisableTorchFunctionSubclass(), torch.no_grad():
            for call in self.calls:
                results = tensors_in(call.func(*call.pargs, **call.pkwargs))
                for i, t in call.fresh:
                    t.copy_(results[i])
        self.calls.clear()
        self.read.clear()
        self.held = 0
        return None


def compute_or_resample(cx: CaptureContext, why: str) -> None:
    """The program reads values capture left uncomputed: compute them (:class:`Replay`), or
    capture again computing every call (``why``)."""
    unsampled = cx.unsampled
    assert unsampled is not None
    replay = unsampled.replay
    if replay is None:
        cx.resample(why)
    failed = replay.compute(moved=not cx.rng.untouched())
    if failed is not None:
        cx.resample(f"{why} ({failed})")
    unsampled.storages.clear()
    unsampled.calls -= replay.skips
    replay.skips = 0

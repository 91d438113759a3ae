"""What ``plait.explain`` reports of ops: the *compiled* ops of a call are the IR nodes of the
regions it ran compiled (as captured, opaque nodes apart), the *eager* ops are the ATen operators
that ran outside any compiled region (counted by a ``TorchDispatchMode``); both are measured on
the first call that runs the root's plan (:meth:`OpCounts.measuring`), and again on the next one
after a region's calls began to run another way (split for hooks below it, or whole again).
A call in which a region's capture ran its Python (it went on eagerly from a refusal,
:mod:`plait.frontend.continuation`) counted none of that region's ops: it is measured again on
the next call (:meth:`OpCounts.uncounted`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from plait.frontend import CapturedProgram


class _OpCounter(TorchDispatchMode):
    """Counts the ATen operators that run eagerly, by the module whose Python runs them: the top
    of ``where`` (None: a region engine runs, nothing is counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str | None] = []
        self.eager: Counter[str] = Counter()
        self.missed = False  # NOTE: a region's ops ran uncounted (OpCounts.uncounted)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.where and self.where[-1] is not None:
            self.eager[self.where[-1]] += 1
        return func(*args, **(kwargs or {}))


class OpCounts:
    """The op counts of one module tree's regions, measured once (``measured``: None until a
    measurement finished)."""

    def __init__(self) -> None:
        self.counter: _OpCounter | None = None
        self.measured: dict[str, Any] | None = None
        self.compiled_ops: Counter[str] = Counter()
        self.opaque_ops: Counter[str] = Counter()

    def note_compiled(self, path: str, prog: CapturedProgram) -> None:
        """A region ran compiled: count its IR nodes while a measurement runs."""
        graph = prog.graph if self.counter is not None else None
        if graph is None:
            return
        opaque = sum(1 for n in graph.nodes if n.op == "opaque")
        self.compiled_ops[path] += len(graph.nodes) - opaque
        self.opaque_ops[path] += opaque

    def uncounted(self) -> None:
        """A region's call ran its Python at capture, its ops uncounted, and its calls run
        another way from now on (split): the measurement this call runs is not kept, and one
        kept already is measured again on the next call of the root's plan."""
        if self.counter is not None:
            self.counter.missed = True
        else:
            self.measured = None

    @contextlib.contextmanager
    def counting(self, path: str | None) -> Iterator[None]:
        """While a measurement runs, the ATen ops of the block count for module ``path``
        (eagerly run Python), or not at all (None: a region engine runs)."""
        counter = self.counter
        if counter is None:
            yield
            return
        counter.where.append(path)
        try:
            yield
        finally:
            counter.where.pop()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """The first call that runs the root's plan counts its ops (see the module doc); not one
        under ``torch.autocast``: the ops an ATen kernel calls inside a dispatch mode skip
        autocast, so its result could change (``nn.TransformerEncoderLayer``'s fused kernel
        returned float32 where eager's returns bfloat16): a later call is measured."""
        busy = self.measured is not None or self.counter is not None
        if busy or any(torch.is_autocast_enabled(d) for d in ("cpu", "cuda")):
            yield
            return
        counter = _OpCounter()
        self.counter = counter
        self.compiled_ops.clear()
        self.opaque_ops.clear()
        ok = False
        try:
            with counter:
                yield
            ok = True
        finally:
            self.counter = None
            if ok and not counter.missed:
                self.measured = {
                    "eager": dict(counter.eager),
                    "compiled": dict(self.compiled_ops),
                    "opaque": dict(self.opaque_ops),
                }

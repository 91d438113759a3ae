"""A compiled callable's specializations: a captured program behind its guards with the
executor its backend made (:class:`Specialization`), and the public view of one as its users ran
it (:class:`SpecializationUse`, what :func:`plait.conformance.check` reads).

Example:
    >>> import torch, plait
    >>> f = plait.compile(lambda x: x + 1, backend="eager", options={"cache": False})
    >>> _ = f(torch.randn(2))
    >>> s = f.specializations[0]
    >>> s.reason is None, len(s.key)
    (True, 32)
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from plait import logs
from plait.backends import Compiled
from plait.frontend import CapturedProgram, Executor
from plait.guards.guard import Evaluators, GuardSet
from plait.ir import Graph
from plait.manifest import Manifest
from plait.settings import applied_state


@dataclass
class Specialization:
    """A captured program behind its guards (capture's, plus those the compile added, such as
    frozen parameters), the executor its backend made for it, and its manifest."""

    program: CapturedProgram
    compiled: Compiled
    reason: str | None  # why it was captured: None for the first, else the failed guards
    settings: dict[str, Any] = field(default_factory=dict)  # the call's, when it was created
    # NOTE: user calls it ran (not the gate's pinned calls), counted without a lock: concurrent
    # calls may undercount, never to 0 once one ran
    calls: int = 0
    evaluators: Evaluators | None = field(default=None, repr=False)  # NOTE: what runs `guards`
    guards: GuardSet = field(init=False)
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.guards = GuardSet([*self.program.guards, *self.compiled.guards], self.evaluators)
        # NOTE: the identity of a specialization: its program and its guard set
        digest = hashlib.sha256((self.program.semantic_hash or "eager fallback").encode())
        for text in self.guards.texts():
            digest.update(b"\n" + text.encode())
        self.key = digest.hexdigest()[:32]

    @property
    def executor(self) -> Executor | None:
        return self.compiled.executor

    @property
    def manifest(self) -> Manifest:
        return self.compiled.manifest

    @property
    def graph(self) -> Graph | None:
        return self.program.graph

    @property
    def semantic_hash(self) -> str | None:
        return self.program.semantic_hash

    @property
    def fallback_reason(self) -> str | None:
        return self.program.fallback_reason

    @property
    def opaque_counts(self) -> dict[str, int]:
        return self.program.opaque_counts


class SpecializationMissError(LookupError):
    """A call pinned to one specialization (``call_specialization``) that its guards refuse."""


@dataclass(frozen=True)
class SpecializationUse:
    """One specialization of a compiled callable as its users ran it (the public artifact
    protocol: what :func:`plait.conformance.check` reads).

    ``key`` names it (its program's semantic hash and its guard set), ``index`` its place in
    ``compiled.specializations``, ``calls`` the user calls it ran, ``settings`` the settings
    of those calls (grad mode, default dtype, autocast, threads, precision and determinism
    flags: its guards pin each, so every call it runs had them; see
    :func:`plait.settings.call_state`), ``guards`` its guard texts and ``manifest`` its
    manifest. ``applied()`` runs a block under ``settings``.

    Example:
        >>> import torch, plait
        >>> f = plait.compile(lambda x: x * 2, backend="eager", options={"cache": False})
        >>> with torch.no_grad():
        ...     _ = f(torch.randn(3))
        >>> use = f.specialization_uses()[0]
        >>> use.calls, use.settings["torch.is_grad_enabled()"]
        (1, False)
        >>> with use.applied():
        ...     torch.equal(f.call_specialization(use.key, torch.ones(3)), torch.full((3,), 2.0))
        True
    """

    index: int
    key: str
    calls: int
    settings: Mapping[str, Any]
    guards: tuple[str, ...]
    manifest: Manifest

    @classmethod
    def of(cls, index: int, s: Specialization) -> SpecializationUse:
        return cls(index, s.key, s.calls, dict(s.settings), tuple(s.guards.texts()), s.manifest)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        with applied_state(self.settings):
            yield


def log_specialization(name: str, index: int, spec: Specialization) -> None:
    """The ``guards`` channel: each new specialization, why, and (debug) its guards."""
    if not logs.enabled("guards"):
        return
    why = "first call" if spec.reason is None else f"recompiled: {spec.reason}"
    texts = spec.guards.texts()
    logs.emit("guards", "specialization", f"{name}: specialization {index} ({why}), "
              f"{len(texts)} guards", index=index, reason=spec.reason)  # fmt: skip
    logs.debug("guards", "guard_set", lambda: "\n".join([f"{name} [{index}]:", *texts]))


class LookupOrder:
    """The order a call tries its engine's specializations in: the order they were made, except
    that one whose guards on the Python values the program read failed (a value changed for
    good: a library patched ``nn.Module.__init__``, a flag the program reads was set) goes last
    once a later one admits a call. Such a specialization otherwise costs every later call its
    failing check first, and a failing check of the Python values walks all of them again (12
    ms a call on a Llama of 8 layers). A call whose inputs an earlier one does not admit (a new
    size, another grad mode) leaves the order as it is: a static specialization stays ahead of
    the symbolic one made after it. The order is a tuple replaced whole, so a call reads it
    without the lock; it is changed only under the engine's lock, taken without waiting (a
    compile holding it leaves the order as it is).

    Example:
        >>> import threading
        >>> class Spec:
        ...     def __init__(self, ok, stale): self.ok, self.is_stale = ok, stale
        ...     @property
        ...     def guards(self): return self
        ...     def holds(self, env): return self.ok
        ...     def stale(self, env): return self.is_stale
        >>> order = LookupOrder(threading.RLock())
        >>> old, wrong_size, fresh = Spec(False, True), Spec(False, False), Spec(True, False)
        >>> for s in (old, wrong_size, fresh): order.add(s)
        >>> order.first_holding(None) is fresh
        True
        >>> [s is wrong_size for s in order.order], order.order[-1] is old
        ([True, False, False], True)
    """

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.order: tuple[Any, ...] = ()

    def add(self, spec: Any) -> None:
        """``spec``, just made (under the engine's lock), goes last."""
        self.order = (*self.order, spec)

    def first_holding(self, env: Any) -> Any:
        """The first specialization whose guards hold for ``env`` (None): the stale ones it
        passed over go last."""
        order = self.order
        for i, spec in enumerate(order):
            if spec.guards.holds(env):
                if i and self._lock.acquire(blocking=False):
                    try:
                        self._demote([s for s in order[:i] if s.guards.stale(env)])
                    finally:
                        self._lock.release()
                return spec
        return None

    def _demote(self, stale: list[Any]) -> None:
        if stale:
            ids = {id(s) for s in stale}
            self.order = (*(s for s in self.order if id(s) not in ids), *stale)

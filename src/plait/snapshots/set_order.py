"""The iteration order of the sets a fingerprint describes, kept aside from their contents.

A fingerprint (:mod:`plait.snapshots.fingerprint`) describes a set by its elements in sorted
order (of their descriptions), so that equal sets describe alike in every process: a set of
strings iterates in an order the process's hash seed decides (``PYTHONHASHSEED``), and any set
in an order that may depend on how it was built. What a loop over the set sees is its iteration
order, so that order is kept as a :class:`SetOrder`, with the names through which code can reach
the set (``gates``): the attribute, class attribute or global that holds it and those of what
holds that (None: reached without a name, as an argument or a default is). Code that never reads
one of those names cannot iterate the set, except through a computed name (``getattr(obj,
name)``, ``vars(obj)``: the fingerprint's blind spots); a snapshot keeps the orders of the sets
whose gates the capture's code read (:func:`exposed`), and a warm start uses it only where those
sets iterate in the same order now.

Example:
    >>> with collecting() as found:
    ...     with gate("NAMES", reset=True):
    ...         perm = record(["'b'", "'a'"], [[], []], "Net.NAMES")  # NOTE: iterates b, a
    >>> perm
    [1, 0]
    >>> found
    [SetOrder(what='Net.NAMES', gates=frozenset({'NAMES'}), order=(1, 0))]
    >>> exposed(found, frozenset({"forward"})), exposed(found, frozenset({"NAMES"})) == found
    ([], True)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SetOrder:
    """The order a set iterates in: ``order[i]`` is the position in iteration order of the
    element described ``i``-th (sorted); ``what`` says where it is; ``gates``: the names code
    reads to reach it (None: always reached)."""

    what: str
    gates: frozenset[str] | None
    order: tuple[int, ...]


class _Collector:
    def __init__(self) -> None:
        self.found: list[SetOrder] = []
        self.gates: tuple[str, ...] | None = None


_ACTIVE: ContextVar[_Collector | None] = ContextVar("plait_set_orders", default=None)


@contextmanager
def collecting() -> Iterator[list[SetOrder]]:
    """Collect the :class:`SetOrder` of every set described inside, in the order met."""
    token = _ACTIVE.set(_Collector())
    try:
        collector = _ACTIVE.get()
        assert collector is not None
        yield collector.found
    finally:
        _ACTIVE.reset(token)


@contextmanager
def gate(name: str, reset: bool = False) -> Iterator[None]:
    """Values described inside are reached through ``name`` (an attribute, a global) as well
    as through what reached the value holding it; ``reset``: through ``name`` only (a class
    attribute, which code reaches by its name through the class or an instance)."""
    collector = _ACTIVE.get()
    if collector is None:
        yield
        return
    before = collector.gates
    if reset:
        collector.gates = (name,)
    elif before is not None:
        collector.gates = (*before, name)
    try:
        yield
    finally:
        collector.gates = before


def mark() -> int:
    """The number of orders collected so far (-1: none is being collected)."""
    collector = _ACTIVE.get()
    return -1 if collector is None else len(collector.found)


def take(start: int) -> list[SetOrder]:
    """Remove and return the orders collected since ``mark()`` returned ``start``."""
    collector = _ACTIVE.get()
    if collector is None or start < 0:
        return []
    out = collector.found[start:]
    del collector.found[start:]
    return out


def record(keys: Sequence[str], nested: Sequence[Sequence[SetOrder]], what: str) -> list[int]:
    """Record a set whose elements, in iteration order, have the sort keys ``keys`` (and the
    orders ``nested`` collected while describing them); returns the permutation that sorts
    them. Nested orders are recorded after the set's own, in sorted order (so every process
    that describes equal sets meets them in one order)."""
    perm = sorted(range(len(keys)), key=keys.__getitem__)
    collector = _ACTIVE.get()
    if collector is not None:
        if len(keys) > 1:
            gates = None if collector.gates is None else frozenset(collector.gates)
            collector.found.append(SetOrder(what, gates, tuple(perm)))
        for i in perm:
            collector.found.extend(nested[i] if i < len(nested) else ())
    return perm


def exposed(orders: Iterable[SetOrder], read: frozenset[str] | None) -> list[SetOrder]:
    """The orders of the sets that code reading the names ``read`` can reach (None: all)."""
    return [o for o in orders if read is None or o.gates is None or not o.gates.isdisjoint(read)]


def to_doc(orders: Sequence[SetOrder], read: frozenset[str] | None) -> list[list[Any]]:
    """The exposed ones of ``orders`` as JSON: ``[index, what, order]`` (index: in ``orders``)."""
    keep = {id(o) for o in exposed(orders, read)}
    return [[i, o.what, list(o.order)] for i, o in enumerate(orders) if id(o) in keep]


def changed(saved: Any, orders: Sequence[SetOrder]) -> str | None:
    """Why a set of ``saved`` (from :func:`to_doc`) is not as it was among ``orders`` (the
    same description made now), or None when each iterates in the order it did."""
    for index, what, order in saved:
        now = orders[index] if isinstance(index, int) and 0 <= index < len(orders) else None
        if now is None or now.what != what or list(now.order) != list(order):
            return (
                f"the set {what} iterates in another order than at capture (the process's hash "
                "seed, PYTHONHASHSEED, or how the set was built decides it)"
            )
    return None

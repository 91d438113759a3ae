"""The native form of the Python-values guard (op PYVALUES: identities, dict and type version
tags) holds exactly when the guard's Python read does, for every kind of change to what the
program read, and again after each change is undone."""

from __future__ import annotations

import functools
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.guards import GuardEnv, native
from tests.util import set_backend_flag

LIMIT = 0.5
# NOTE: sets of classes and of strings: guarded natively by their members (op PYVALUES, kind 9)
KINDS = {int, float}
NAMES = {"relu", "clamp"}


class _AllEqual(type):
    """A metaclass whose classes all compare and hash equal: a set of them is not checked by
    membership (a swapped class would still be "in" it), its Python read decides."""

    def __eq__(cls, other: object) -> bool:
        return isinstance(other, _AllEqual)

    def __hash__(cls) -> int:
        return 0


class Odd(metaclass=_AllEqual):
    pass


class Other(metaclass=_AllEqual):
    pass


ODD = {Odd}


class Holder:
    """A config object of a user class (compared by its contents)."""

    EPS = 1e-3

    def __init__(self) -> None:
        self.sizes = [1, 2]
        self.table = {"k": 1.0}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alpha = 0.5
        self.holder = Holder()
        self.ns = types.SimpleNamespace(flag=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x) * self.alpha + self.holder.EPS
        y = y * self.holder.sizes[1] * self.holder.table["k"]
        y = y.clamp(max=LIMIT) if "clamp" in NAMES else y
        y = y * 2.0 if float in KINDS else y
        return y.relu() if self.ns.flag else y


def _set(obj: Any, name: str, value: Any) -> Callable[[], Callable[[], None]]:
    def change() -> Callable[[], None]:
        before = getattr(obj, name)
        setattr(obj, name, value)
        return lambda: setattr(obj, name, before)

    return change


def _changes(m: Net) -> dict[str, Callable[[], Callable[[], None]]]:
    def append() -> Callable[[], None]:
        m.holder.sizes.append(3)
        return m.holder.sizes.pop

    def item() -> Callable[[], None]:
        m.holder.table["k"] = 2.0
        return lambda: m.holder.table.__setitem__("k", 1.0)

    def set_add(members: set[Any], x: Any) -> Callable[[], Callable[[], None]]:
        def change() -> Callable[[], None]:
            members.add(x)
            return lambda: members.discard(x)

        return change

    def set_remove(members: set[Any], x: Any) -> Callable[[], Callable[[], None]]:
        def change() -> Callable[[], None]:
            members.discard(x)
            return lambda: members.add(x)

        return change

    def equal_rebind() -> Callable[[], None]:
        before = m.alpha
        m.alpha = float("0.5")  # NOTE: another object, same bits: the guard still holds
        return lambda: setattr(m, "alpha", before)

    return {
        "attribute": _set(m, "alpha", -0.5),
        "signed-zero": _set(m, "alpha", -0.0),
        "equal-rebind": equal_rebind,
        "class-attribute": _set(Holder, "EPS", 2e-3),
        "list-in-place": append,
        "dict-in-place": item,
        "namespace": _set(m.ns, "flag", False),
        "global": _set(sys.modules[__name__], "LIMIT", 0.75),
        "hook": lambda: m.lin.register_forward_hook(lambda *a: None).remove,
        "class-set-add": set_add(KINDS, str),
        "class-set-remove": set_remove(KINDS, float),
        "string-set-add": set_add(NAMES, "gelu"),
        "string-set-remove": set_remove(NAMES, "clamp"),
    }


@pytest.mark.parametrize("name", list(_changes(Net())))
def test_native_agrees_with_the_python_read(name: str) -> None:
    m = Net()
    cm = plait.compile(m, backend="eager", options={"cache": False})
    x = torch.randn(2, 4)
    with torch.no_grad():
        cm(x)
    spec = cm.specializations[0]
    eng = cm._plait
    spec_, leaves, _ = eng.adapter.flatten((x,), {})

    def agree() -> bool:
        env = GuardEnv(spec_, leaves, m, eng.fetch())
        with torch.no_grad():  # NOTE: the grad mode of the captured call
            fast, slow = spec.guards.holds(env), spec.guards.holds_python(env)
        assert fast == slow, spec.guards.explain(env)
        return fast

    assert agree()
    if native.status().available:
        # NOTE: unchanged state, sets included, holds without a Python read
        reads = spec.guards.holds.python_reads  # type: ignore[attr-defined]
        env = GuardEnv(spec_, leaves, m, eng.fetch())
        with torch.no_grad():
            assert spec.guards.holds(env)
        assert spec.guards.holds.python_reads == reads  # type: ignore[attr-defined]
    undo = _changes(m)[name]()
    assert agree() == (name == "equal-rebind")
    undo()
    assert agree()
    if native.status().available:
        assert spec.guards.evaluator == "native"


class ReadsOddSet(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3.0 if Odd in ODD else x


def test_a_set_of_classes_that_compare_equal_is_read_in_python() -> None:
    """Membership cannot tell ``Other`` from ``Odd`` (their metaclass makes them equal): the
    set's Python read decides, and a swapped member fails the guard."""
    m = ReadsOddSet()
    cm = plait.compile(m, backend="eager", options={"cache": False})
    x = torch.randn(2, 4)
    with torch.no_grad():
        cm(x)
    spec, eng = cm.specializations[0], cm._plait
    spec_, leaves, _ = eng.adapter.flatten((x,), {})

    def holds() -> bool:
        env = GuardEnv(spec_, leaves, m, eng.fetch())
        with torch.no_grad():
            fast, slow = spec.guards.holds(env), spec.guards.holds_python(env)
        assert fast == slow, spec.guards.explain(env)
        return fast

    assert holds()
    ODD.discard(Odd)
    ODD.add(Other)
    try:
        assert not holds()
    finally:
        ODD.discard(Other)
        ODD.add(Odd)
    assert holds()


LOG = logging.getLogger("tests.guards.python_values_native")
TABLE = {"k": 1.0}


@functools.cache
def _cached(n: int) -> float:
    return TABLE["k"] * n


@functools.lru_cache(maxsize=2)
def _bounded(n: int) -> float:
    return TABLE["k"] * n


class LibraryNet(nn.Module):
    """Reads state through library code: a logger's level, a functools cache's result, a
    getter of process state in C, a property of a backends module, the attention fast-path
    flag (plait.frontend.library_reads)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * float(LOG.getEffectiveLevel()) * _cached(2) * _bounded(2)
        y = y * 2.0 if torch.is_anomaly_enabled() else y
        y = y * 3.0 if torch.backends.cudnn.deterministic else y
        return y * 5.0 if torch.backends.mha.get_fastpath_enabled() else y


def _library_changes() -> dict[str, Callable[[], Callable[[], None]]]:
    def level() -> Callable[[], None]:
        before = LOG.level
        LOG.setLevel(logging.DEBUG if before != logging.DEBUG else logging.INFO)
        return lambda: LOG.setLevel(before)

    def refilled() -> Callable[[], None]:
        TABLE["k"] = 4.0
        _cached.cache_clear()
        _cached(2)

        def undo() -> None:
            TABLE["k"] = 1.0
            _cached.cache_clear()
            _cached(2)  # NOTE: another float object of the same bits: the guard holds

        return undo

    def evicted() -> Callable[[], None]:
        TABLE["k"] = 4.0
        _bounded(3), _bounded(4), _bounded(2)  # NOTE: 2 evicted, then computed again

        def undo() -> None:
            TABLE["k"] = 1.0
            _bounded(5), _bounded(6), _bounded(2)

        return undo

    def other_miss() -> Callable[[], None]:
        _bounded(7)  # NOTE: a miss that evicts nothing the program read: the guard holds
        return lambda: None

    def anomaly() -> Callable[[], None]:
        torch.autograd.set_detect_anomaly(True)
        return lambda: torch.autograd.set_detect_anomaly(False)

    def deterministic() -> Callable[[], None]:
        set_backend_flag(torch.backends.cudnn, "deterministic", True)
        return lambda: set_backend_flag(torch.backends.cudnn, "deterministic", False)

    def fastpath() -> Callable[[], None]:
        torch.backends.mha.set_fastpath_enabled(False)
        return lambda: torch.backends.mha.set_fastpath_enabled(True)

    return {
        "logger-level": level,
        "cache-refilled": refilled,
        "bounded-cache-evicted": evicted,
        "bounded-cache-other-miss": other_miss,
        "anomaly": anomaly,
        "cudnn-deterministic": deterministic,
        "attention-fast-path": fastpath,
    }


@pytest.mark.parametrize("name", list(_library_changes()))
def test_library_state_native_agrees_with_the_python_read(name: str) -> None:
    m = LibraryNet()
    cm = plait.compile(m, backend="eager", options={"cache": False})
    x = torch.randn(2, 4)
    _cached(2)
    _bounded.cache_clear()
    _bounded(2)
    cm(x)
    spec = cm.specializations[0]
    eng = cm._plait
    spec_, leaves, _ = eng.adapter.flatten((x,), {})

    def agree() -> bool:
        env = GuardEnv(spec_, leaves, m, eng.fetch())
        fast, slow = spec.guards.holds(env), spec.guards.holds_python(env)
        assert fast == slow, spec.guards.explain(env)
        return fast

    assert agree()
    undo = _library_changes()[name]()
    try:
        assert agree() == (name == "bounded-cache-other-miss")
    finally:
        undo()
    assert agree()
    if native.status().available:
        assert spec.guards.evaluator == "native"

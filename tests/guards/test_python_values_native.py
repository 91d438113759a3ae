"""The native form of the Python-values guard (op PYVALUES: identities, dict and type version
tags) holds exactly when the guard's Python read does, for every kind of change to what the
program read, and again after each change is undone."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.guards import GuardEnv, native

LIMIT = 0.5


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
        y = y.clamp(max=LIMIT)
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
    undo = _changes(m)[name]()
    assert agree() == (name == "equal-rebind")
    undo()
    assert agree()
    if native.status().available:
        assert spec.guards.evaluator == "native"

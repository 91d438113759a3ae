"""A model that memoizes a tensor in a plain Python value it holds (not a module attribute: a
user object, a dict, a dataclass, a ``SimpleNamespace``, a list it appends to, an object reached
as a global, one written by a submodule's forward) answers as eager on every call.

Capture refuses such a program (it changes a value it reads: a compiled call would not replay
the store), so the call runs eagerly, and the tensor the failed capture stored is put back out
of the value first (plait.frontend.pyrollback): the eager run stores eager's. Before, only
module attributes, globals and the lists and dicts they held directly were put back: a memo on
``self.state.scale`` kept the capture's tensor, and every call of the model, the first one's
fallback included, raised GraphCaptureError ("kept in Python state"). With ``fullgraph=True``
the refusal names the line that made the store."""

from __future__ import annotations

import copy
import dataclasses
import types
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import contract_tol

TOL = contract_tol("model", torch.float32)


class State:
    pass


@dataclasses.dataclass
class Memo:
    scale: torch.Tensor | None = None


SHARED = State()  # NOTE: the global variant's memo (each test clears it)


class OnObject(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.st = State()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = getattr(self.st, "scale", None)
        if s is None:
            s = self.lin.weight.sum()
            self.st.scale = s  # STORE: object
        return self.lin(x) * s


class InDict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.cache: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.cache.get("scale")
        if s is None:
            s = self.lin.weight.sum()
            self.cache["scale"] = s  # STORE: dict
        return self.lin(x) * s


class OnGlobal(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = getattr(SHARED, "scale", None)
        if s is None:
            s = self.lin.weight.sum()
            SHARED.scale = s  # STORE: global
        return self.lin(x) * s


class OnDataclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.st = Memo()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.st.scale is None:
            self.st.scale = self.lin.weight.sum()  # STORE: dataclass
        return self.lin(x) * self.st.scale


class OnNamespace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.st = types.SimpleNamespace(scale=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.st.scale is None:
            self.st.scale = self.lin.weight.sum()  # STORE: namespace
        return self.lin(x) * self.st.scale


class Appending(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.hist: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.hist.append(y.sum())  # STORE: list
        return y * len(self.hist)


class Inner(nn.Module):
    def __init__(self, st: State) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.st = st

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = getattr(self.st, "scale", None)
        if s is None:
            s = self.lin.weight.sum()
            self.st.scale = s  # STORE: submodule
        return self.lin(x) * s


class BySubmodule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.st = State()
        self.sub = Inner(self.st)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.sub(x) + 1


MODELS = {
    "object": OnObject,
    "dict": InDict,
    "global": OnGlobal,
    "dataclass": OnDataclass,
    "namespace": OnNamespace,
    "list": Appending,
    "submodule": BySubmodule,
}


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# STORE: {marker}"):
                return n
    raise AssertionError(marker)


def _memo(model: nn.Module, shared: dict[str, Any]) -> list[Any]:
    """What the model memoized (``shared``: the global object's attributes for it)."""
    if isinstance(model, Appending):
        return list(model.hist)
    if isinstance(model, InDict):
        found = model.cache.get("scale")
    else:
        found = (shared if isinstance(model, OnGlobal) else vars(model.st)).get("scale")
    return [found]


def _swap_shared(to: dict[str, Any]) -> dict[str, Any]:
    """Gives the global object ``to``'s attributes; returns those it had."""
    had = dict(vars(SHARED))
    vars(SHARED).clear()
    vars(SHARED).update(to)
    return had


@pytest.mark.parametrize("variant", sorted(MODELS))
def test_a_memo_in_a_python_value_matches_eager_on_every_call(variant: str) -> None:
    vars(SHARED).clear()
    torch.manual_seed(0)
    model = MODELS[variant]().eval()
    twin = copy.deepcopy(model)
    twin_shared: dict[str, Any] = {}  # NOTE: the global object as the eager twin leaves it
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureFallbackWarning)
        for batch in (3, 2, 3, 1):
            x = torch.randn(batch, 8, generator=gen)
            got = compiled(x)
            ours = _swap_shared(twin_shared)
            want = twin(x)
            twin_shared = _swap_shared(ours)
            torch.testing.assert_close(got, want, **TOL)
    assert any(issubclass(w.category, CaptureFallbackWarning) for w in caught)
    memo, expected = _memo(model, vars(SHARED)), _memo(twin, twin_shared)
    assert [type(t) for t in memo] == [torch.Tensor] * len(expected)
    for a, b in zip(memo, expected):
        torch.testing.assert_close(a, b, **TOL)
    with torch.no_grad():  # NOTE: the module itself, called directly, runs too
        model(torch.randn(2, 8, generator=gen))


@pytest.mark.parametrize("variant", sorted(MODELS))
def test_fullgraph_names_the_line_that_stores_the_memo(variant: str) -> None:
    vars(SHARED).clear()
    torch.manual_seed(0)
    model = MODELS[variant]().eval()
    twin = copy.deepcopy(model)
    compiled = plait.compile(model, fullgraph=True, options={"cache": False})
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with pytest.raises(GraphCaptureError, match="changes Python values it reads") as info:
            compiled(x)
        err = info.value
        assert (err.filename, err.lineno) == (__file__, _line_of(variant)), str(err)
        assert f"{__file__}:{err.lineno}: " in str(err)
        # NOTE: nothing of the failed capture is left in the value: the model runs as eager
        assert _memo(model, vars(SHARED)) == ([] if variant == "list" else [None])
        ours = _swap_shared({})
        want = twin(x)
        _swap_shared(ours)
        torch.testing.assert_close(model(x), want, **TOL)

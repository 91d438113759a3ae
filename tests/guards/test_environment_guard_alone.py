"""The environment a program read is guarded apart from its other Python values: code that sets
a variable again to an equal value (a cache directory set per model, inductor's
``_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR``, written at every call: the re-arm then stops,
tests/guards/test_python_values_rearm.py) fails the native identity check, and the Python read
that follows keys the environment alone, not every value the program read. A changed value
still compiles again, with the new value."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import plait
from plait.frontend import pyvalues
from tests.conformance.models import randn
from tests.util import contract_tol

VARIABLE = "PLAIT_TEST_ENVIRONMENT_SCALE"
SETTINGS = {"shift": 0.5, "names": ["a", "b", "c"], "depth": 3}


def _program(x: torch.Tensor) -> torch.Tensor:
    scale = float(os.environ.get(VARIABLE, "2"))
    return torch.tanh(x) * scale + SETTINGS["shift"] * len(SETTINGS["names"])


@pytest.fixture
def variable() -> Iterator[None]:
    os.environ[VARIABLE] = "2.0"
    yield
    os.environ.pop(VARIABLE, None)


def _roots_keyed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each root value a Python read keys from now on is appended to the returned list."""
    keyed: list[Any] = []
    real = pyvalues._Walk.key

    def key(self: Any, v: Any, depth: int = 0, shallow: bool = False) -> Any:
        if depth == 0:
            keyed.append(v)
        return real(self, v, depth, shallow)

    monkeypatch.setattr(pyvalues._Walk, "key", key)
    return keyed


def test_an_equal_value_set_again_keys_the_environment_alone(
    variable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = plait.compile(_program)
    tol = contract_tol("pointwise", torch.float32)
    x = randn(3, 4, seed=1)
    torch.testing.assert_close(compiled(x), _program(x), **tol)
    keyed = _roots_keyed(monkeypatch)
    os.environ[VARIABLE] = "".join(["2", ".0"])  # NOTE: an equal value, a new object
    x = randn(3, 4, seed=2)
    torch.testing.assert_close(compiled(x), _program(x), **tol)
    assert len(compiled.specializations) == 1
    assert len(keyed) == 1 and keyed[0] is vars(os.environ)["_data"], keyed[:5]


def test_a_changed_value_compiles_again_with_it(variable: None) -> None:
    compiled = plait.compile(_program)
    tol = contract_tol("pointwise", torch.float32)
    x = randn(3, 4, seed=3)
    torch.testing.assert_close(compiled(x), _program(x), **tol)
    os.environ[VARIABLE] = "3.0"
    x = randn(3, 4, seed=4)
    torch.testing.assert_close(compiled(x), _program(x), **tol)
    assert len(compiled.specializations) == 2

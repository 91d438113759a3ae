"""Python values a capture reads through ``nn.Module`` attribute lookups are guarded where the
lookup finds nothing (``hasattr``, ``getattr`` with a default, a user ``__getattr__`` that
answers a default), where the module lies outside the compiled module (a global module a
compiled function calls, a module held in a plain list: its training flag, its parameter,
buffer and submodule slots), and where the program iterates a compiled module's submodule
table (a layer appended to an ``nn.Sequential`` or ``nn.ModuleList``). Each case calls the
compiled model, changes the value, and calls again: every call equals eager PyTorch on fresh
random inputs, and the change recompiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from tests.capture.helpers import recompiled_once, same_as_eager

NO_CACHE = {"cache": False}


# --- a lookup that finds nothing --------------------------------------------------------------
class Optional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if hasattr(self, "extra"):
            y = self.extra(y) if isinstance(self.extra, nn.Module) else y * self.extra
        return y


class Defaulted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * getattr(self, "gain", 1.0)


class OwnDefault(nn.Module):
    """A ``__getattr__`` of its own answers a default without PyTorch's lookup."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def __getattr__(self, name: str) -> Any:
        if name == "gain":
            return 1.0
        return super().__getattr__(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.gain


class Fallback(nn.Module):
    """A ``__getattr__`` of its own answers from a table when PyTorch's lookup fails."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.table = {"gain": 2.0}

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return self.table[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.gain


def test_an_attribute_set_after_hasattr_found_none(evaluator: str) -> None:
    model = Optional()
    recompiled_once(model, lambda: setattr(model, "extra", 3.0))


def test_a_submodule_set_after_hasattr_found_none(evaluator: str) -> None:
    model = Optional()
    recompiled_once(model, lambda: setattr(model, "extra", nn.Tanh()))


def test_an_attribute_set_after_getattr_took_its_default(evaluator: str) -> None:
    model = Defaulted()
    recompiled_once(model, lambda: setattr(model, "gain", 3.0))


@pytest.mark.parametrize("make", [OwnDefault, Fallback])
def test_an_attribute_set_after_a_user_getattr_answered(
    evaluator: str, make: Callable[[], nn.Module]
) -> None:
    model = make()
    recompiled_once(model, lambda: setattr(model, "gain", 3.0))


# --- modules outside the compiled module ------------------------------------------------------
class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0 if self.training else x - 1.0


BRANCHY = Branchy()
LINEAR = nn.Linear(6, 6)
SEQUENCE = nn.Sequential(nn.Linear(6, 6), nn.ReLU())


def _through_branchy(x: torch.Tensor) -> torch.Tensor:
    return BRANCHY(x) + 1.0


def _through_linear(x: torch.Tensor) -> torch.Tensor:
    return LINEAR(x).relu()


def _through_sequence(x: torch.Tensor) -> torch.Tensor:
    return SEQUENCE(x) * 2.0


class Helped(nn.Module):
    """A helper module held in a plain list: not a submodule, outside the compiled module."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.helpers = [Branchy()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.helpers[0](self.lin(x))


@pytest.fixture
def fresh_globals() -> Any:
    global LINEAR, SEQUENCE
    LINEAR, SEQUENCE = nn.Linear(6, 6), nn.Sequential(nn.Linear(6, 6), nn.ReLU())
    BRANCHY.train()
    yield
    BRANCHY.train()


def test_the_training_flag_of_a_global_module(evaluator: str, fresh_globals: Any) -> None:
    recompiled_once(_through_branchy, BRANCHY.eval)


def test_the_training_flag_of_a_module_in_a_plain_list(evaluator: str) -> None:
    model = Helped()
    recompiled_once(model, model.helpers[0].eval)


def test_a_parameter_of_a_global_module_replaced(evaluator: str, fresh_globals: Any) -> None:
    recompiled_once(
        _through_linear, lambda: setattr(LINEAR, "weight", nn.Parameter(torch.randn(6, 6)))
    )


def test_a_parameter_of_a_global_module_set_to_none(evaluator: str, fresh_globals: Any) -> None:
    recompiled_once(_through_linear, lambda: setattr(LINEAR, "bias", None))


def test_a_submodule_of_a_global_module_replaced(evaluator: str, fresh_globals: Any) -> None:
    recompiled_once(_through_sequence, lambda: SEQUENCE.__setitem__(1, nn.Tanh()))


def test_a_submodule_appended_to_a_global_module(evaluator: str, fresh_globals: Any) -> None:
    recompiled_once(_through_sequence, lambda: SEQUENCE.append(nn.Tanh()))


# --- submodules added to the compiled module --------------------------------------------------
class Stacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_appended_to_a_compiled_sequential(evaluator: str) -> None:
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU())
    recompiled_once(model, lambda: model.append(nn.Linear(6, 6)))


def test_a_layer_appended_to_a_module_list(evaluator: str) -> None:
    model = Stacked()
    recompiled_once(model, lambda: model.layers.append(nn.Tanh()))


def _built_while_running(x: torch.Tensor) -> torch.Tensor:
    """A module the program builds and fills while it runs (as a cache's ModuleList is)."""
    steps = nn.Sequential()
    steps.append(nn.ReLU())
    steps.append(nn.Tanh())
    return steps(x) * 2.0


def test_a_module_built_while_the_program_runs_is_captured(evaluator: str) -> None:
    compiled = plait.compile(_built_while_running, options=NO_CACHE)
    for seed in (1, 2, 3):
        same_as_eager(compiled, _built_while_running, seed)
    assert len(compiled.specializations) == 1, compiled.recompile_reasons
    assert compiled.specializations[0].fallback_reason is None

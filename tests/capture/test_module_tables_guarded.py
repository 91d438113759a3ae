"""A compiled module's parameter and buffer tables, read as tables, and its instance dict, read
around the attribute hook, are guarded; a changed parameter or buffer layout recompiles.

- a forward that iterates ``parameters()``, ``named_buffers()`` or ``self._parameters``: a
  parameter or buffer registered later recompiles (the tables' names are guarded);
- a forward that reads ``object.__getattribute__(self, "scale")``: a new ``scale`` recompiles
  (the compiled modules' instance dicts are guarded whole);
- a buffer deleted and set again as a plain attribute, a ``bias`` set to ``None``: the module
  state is read again and the call recompiles.

Each case calls the compiled model twice, changes it, and calls twice more: every call equals
eager PyTorch on fresh random inputs, and the change recompiles."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import plait
from tests.capture.helpers import recompiled_once, same_as_eager

NO_CACHE = {"cache": False}


# --- parameter and buffer tables read as tables -----------------------------------------------
class Scaled(nn.Module):
    """Multiplies by each parameter it holds, as ``how`` lists them."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a = nn.Parameter(torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "parameters":
            found = list(self.parameters())
        elif self.how == "named_parameters":
            found = [p for _, p in self.named_parameters()]
        else:
            found = [p for p in self._parameters.values() if p is not None]
        for p in found:
            x = x * p
        return x


class Shifted(nn.Module):
    """Adds each buffer it holds, as ``how`` lists them."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.register_buffer("a", torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "buffers":
            found = list(self.buffers())
        elif self.how == "named_buffers":
            found = [b for _, b in self.named_buffers()]
        else:
            found = [b for b in self._buffers.values() if b is not None]
        for b in found:
            x = x + b
        return x


@pytest.mark.parametrize("how", ["parameters", "named_parameters", "_parameters"])
def test_a_parameter_registered_after_the_table_was_iterated(evaluator: str, how: str) -> None:
    model = Scaled(how)
    compiled = recompiled_once(
        model, lambda: model.register_parameter("b", nn.Parameter(torch.randn(6)))
    )
    assert "_parameters" in compiled.recompile_reasons[0]


@pytest.mark.parametrize("how", ["buffers", "named_buffers", "_buffers"])
def test_a_buffer_registered_after_the_table_was_iterated(evaluator: str, how: str) -> None:
    model = Shifted(how)
    compiled = recompiled_once(model, lambda: model.register_buffer("b", torch.randn(6)))
    assert "_buffers" in compiled.recompile_reasons[0]


def test_a_parameter_registered_in_a_submodule_after_parameters_were_iterated(
    evaluator: str,
) -> None:
    model = nn.Sequential(Scaled("parameters"), Scaled("parameters"))
    recompiled_once(model, lambda: model[1].register_parameter("b", nn.Parameter(torch.randn(6))))


class Decayed(nn.Module):
    """Rebinds a buffer outside forward between calls, and iterates its buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.buffers():
            x = x * b
        return x


def test_a_buffer_rebound_between_calls_does_not_recompile(evaluator: str) -> None:
    """Only the table's names are guarded: a new tensor in a slot is read as the state
    (a compile that freezes the state would guard its identity: not frozen here)."""
    model = Decayed()
    compiled = plait.compile(model, options={**NO_CACHE, "freeze": False})
    for seed in (21, 22, 23):
        same_as_eager(compiled, model, seed)
        model.a = model.a * 0.9
    assert len(compiled.specializations) == 1, compiled.recompile_reasons


# --- the instance dict read around the attribute hook -----------------------------------------
class Bypass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * object.__getattribute__(self, "scale")


class BypassInside(nn.Module):
    """The read is of a submodule's attribute, in the submodule's forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Bypass()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + 1.0


_READ = object.__getattribute__


class BypassAliased(nn.Module):
    """The read through a global alias of ``object.__getattribute__``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * _READ(self, "scale")


@pytest.mark.parametrize("make", [Bypass, BypassAliased])
def test_an_attribute_read_with_object_getattribute(
    evaluator: str, make: Callable[[], nn.Module]
) -> None:
    model = make()
    recompiled_once(model, lambda: setattr(model, "scale", 5.0))


def test_a_submodule_attribute_read_with_object_getattribute(evaluator: str) -> None:
    model = BypassInside()
    recompiled_once(model, lambda: setattr(model.inner, "scale", -3.0))


# --- the module state changed -----------------------------------------------------------------
class Biased(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.register_buffer("b", torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.b


def _rebound_as_attribute(model: Biased) -> None:
    del model.b
    model.b = torch.randn(6)


def test_a_buffer_deleted_and_set_as_an_attribute(evaluator: str) -> None:
    model = Biased()
    recompiled_once(model, lambda: _rebound_as_attribute(model))


def test_a_linear_bias_set_to_none(evaluator: str) -> None:
    model = nn.Linear(6, 6)
    recompiled_once(model, lambda: setattr(model, "bias", None))


def test_a_submodule_bias_set_to_none(evaluator: str) -> None:
    model = Biased()
    recompiled_once(model, lambda: setattr(model.lin, "bias", None))


def test_a_bias_set_to_none_and_back(evaluator: str) -> None:
    model = nn.Linear(6, 6)
    compiled = recompiled_once(model, lambda: setattr(model, "bias", None))
    model.bias = nn.Parameter(torch.randn(6))
    for seed in (15, 16):
        same_as_eager(compiled, model, seed)
    assert all(s.fallback_reason is None for s in compiled.specializations)


class TwoBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(6))
        self.register_buffer("b", torch.randn(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.a * 2.0 - self.b


def _moved(model: TwoBuffers) -> None:
    """A buffer becomes a plain attribute and another is registered: as many state tensors,
    of the same signatures, as before, in other places."""
    a = model.a
    del model.a
    model.a = a * 3.0
    model.register_buffer("c", torch.randn(6))


def test_a_program_of_the_earlier_state_entries_is_not_reused(evaluator: str) -> None:
    model = TwoBuffers()
    compiled = plait.compile(model, options={**NO_CACHE, "freeze": False})
    same_as_eager(compiled, model, 31)
    _moved(model)
    for seed in (32, 33):
        same_as_eager(compiled, model, seed)
    assert len(compiled.specializations) == 2, compiled.recompile_reasons

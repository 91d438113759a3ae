"""Python that PyTorch runs inside a torch call is the program's code, and what it reads is
guarded: an object passed to a torch function or tensor method whose ``__index__`` PyTorch calls
reads a global, and changing that global recaptures. (Capture stops watching new frames while a
call with a rule and plain arguments runs, :meth:`plait.frontend.pyreads.PyReads.pause`: these
calls are the ones it must keep watching.) Each call is checked against eager on fresh inputs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

import plait
from tests.util import assert_bitwise

LENGTH = 3
SHIFT = 1
LOOKUPS = 1


class Length:
    """An index PyTorch reads through ``__index__`` (user code run inside the torch call)."""

    def __index__(self) -> int:
        return LENGTH


class Shift:
    """A start a tensor method reads through ``__index__``."""

    def __index__(self) -> int:
        return SHIFT


def _narrowed(x: torch.Tensor) -> torch.Tensor:
    return torch.narrow(x, 1, 0, Length()) * 2


def _narrowed_from(x: torch.Tensor) -> torch.Tensor:
    return x.narrow(1, Shift(), 2) * 3


class Table(dict):
    """A submodule table of a user type: ``nn.Module.__getattr__`` runs its lookup, the
    program's code, inside PyTorch's own."""

    def __contains__(self, key: object) -> bool:
        return LOOKUPS > 0 and dict.__contains__(self, key)


class Tabled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        object.__setattr__(self, "_modules", Table(self._modules))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def _check(fn: Callable[[torch.Tensor], torch.Tensor], name: str, value: Any) -> None:
    compiled = plait.compile(fn, options={"cache": False})
    module = sys.modules[__name__]
    before = getattr(module, name)
    try:
        for _ in range(2):
            x = torch.randn(4, 6)
            assert_bitwise(compiled(x), fn(x))
        assert len(compiled.specializations) == 1
        setattr(module, name, value)
        x = torch.randn(4, 6)
        assert_bitwise(compiled(x), fn(x))
        assert len(compiled.specializations) == 2, compiled.recompile_reasons
        assert name in compiled.recompile_reasons[0], compiled.recompile_reasons
    finally:
        setattr(module, name, before)


def test_global_read_by_index_inside_a_torch_call_is_guarded() -> None:
    _check(_narrowed, "LENGTH", 5)


def test_global_read_by_index_inside_a_tensor_method_is_guarded() -> None:
    _check(_narrowed_from, "SHIFT", 2)


def test_global_read_by_a_user_table_inside_module_getattr_is_guarded() -> None:
    """Capture stops watching frames while PyTorch looks a submodule up in tables of its own;
    a table of a user type is the program's code, watched."""
    _check(Tabled(), "LOOKUPS", 2)


def test_a_capture_leaves_the_trace_function_as_it_found_it() -> None:
    """The pause around plain calls restores the recorder's trace function every time, and
    the recorder removes it at the end (a debugger's or coverage's stays untouched)."""
    before = sys.gettrace()
    compiled = plait.compile(lambda x: torch.relu(x) + x.sum(), options={"cache": False})
    x = torch.randn(5)
    assert_bitwise(compiled(x), torch.relu(x) + x.sum())
    assert sys.gettrace() is before

"""A compiled callable called under a mode that is not plait's (a user's ``TorchFunctionMode``
or ``TorchDispatchMode``, ``with torch.device(...)``) answers as eager does under that mode: the
mode sees every torch call of the program as written, and none of a compiled program's."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning

TOL = plait.contract.load().tolerance("model", torch.float32)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


class _ScaleAdds(TorchFunctionMode):
    """Multiplies every ``torch.add`` and ``F.linear`` result by 10."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in (torch.add, torch.nn.functional.linear):
            out = out * 10
        return out


class _NegateRelu(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        return -out if func is torch.ops.aten.relu.default else out


def _program(x: torch.Tensor) -> torch.Tensor:
    return torch.add(x, 1).relu() * 2


def _fresh(seed: int) -> torch.Tensor:
    return torch.randn(5, generator=torch.Generator().manual_seed(seed))


def _under(mode: Any, fn: Any, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mode():
            return fn(x)


def test_a_mode_around_calls_changes_them_as_eager() -> None:
    compiled = plait.compile(_program, options={"cache": False})
    for seed, mode in enumerate([_ScaleAdds, _NegateRelu, None, _ScaleAdds, None]):
        x = _fresh(seed)
        if mode is None:
            _close(compiled(x), _program(x))
            continue
        _close(_under(mode, compiled, x), _under(mode, _program, x))


def test_a_mode_around_the_first_call_is_not_captured() -> None:
    for mode in (_ScaleAdds, _NegateRelu):
        compiled = plait.compile(_program, options={"cache": False})
        x = _fresh(10)
        _close(_under(mode, compiled, x), _under(mode, _program, x))
        x = _fresh(11)
        _close(compiled(x), _program(x))


def test_a_default_device_context_gives_eager_devices() -> None:
    def program(x: torch.Tensor) -> torch.Tensor:
        return torch.ones(3) * 2 + x.sum()

    compiled = plait.compile(program, options={"cache": False})
    x = _fresh(20)
    _close(compiled(x), program(x))
    x = _fresh(21)
    with torch.device("meta"), pytest.warns(CaptureFallbackWarning, match="DeviceContext"):
        got, want = compiled(x), program(x)
    assert (got.device, got.dtype, got.shape) == (want.device, want.dtype, want.shape)


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class _ModeInside(nn.Module):
    """Split into regions (a data-dependent branch); its Python enters a mode around ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _Inner(), _Inner()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        if x.sum() > 0:
            x = x + 1
        with _ScaleAdds():
            return self.b(x)


def test_a_region_called_under_a_mode_its_parent_entered_runs_as_written() -> None:
    torch.manual_seed(0)
    model = _ModeInside().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = plait.compile(model, options={"cache": False})
        for seed in range(3):
            x = torch.randn(2, 8, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                _close(compiled(x), model(x))

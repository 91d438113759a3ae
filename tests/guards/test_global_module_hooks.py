"""Global module hooks (``register_module_forward_hook`` and its kin) run for every module call,
so a capture runs them into its program: one registered or removed after the capture is a new
specialization that answers as eager does, never the program captured without (or with) it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import plait
import plait.contract
from plait.errors import CaptureFallbackWarning

TOL = plait.contract.load().tolerance("model", torch.float32)


def _close(got: Any, want: Any) -> None:
    torch.testing.assert_close(got, want, rtol=TOL.rtol, atol=TOL.atol)


def _x(seed: int) -> torch.Tensor:
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(seed))


class _Net(nn.Module):
    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.branch and h.abs().sum() == 0:  # NOTE: a data-dependent branch: regions
            h = h + 1
        return self.b(h)


def _scale_linear(mod: nn.Module, args: Any, out: Any) -> Any:
    return out * 2 if isinstance(mod, nn.Linear) else None


def _shift_input(mod: nn.Module, args: Any) -> Any:
    return (args[0] + 1,) if isinstance(mod, nn.Linear) else None


@contextmanager
def _hooked() -> Iterator[None]:
    handles = [
        nn_module.register_module_forward_hook(_scale_linear),
        nn_module.register_module_forward_pre_hook(_shift_input),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _compare(cm: Any, model: nn.Module, seeds: range) -> None:
    for seed in seeds:
        _close(cm(_x(seed)), model(_x(seed)))


@pytest.mark.parametrize("branch", [False, True], ids=["whole", "regions"])
def test_global_hooks_registered_after_the_first_call_run(branch: bool) -> None:
    torch.manual_seed(0)
    model = _Net(branch).eval()
    _hooks_added_after_the_first_calls(model)


def test_global_hooks_removed_after_the_first_call_no_longer_run() -> None:
    torch.manual_seed(0)
    model = _Net(False).eval()
    with _hooked():
        cm = plait.compile(model, options={"cache": False})
        with torch.no_grad():
            _compare(cm, model, range(2))
    with torch.no_grad():
        _compare(cm, model, range(2, 5))
    assert any("global module hooks" in r for r in cm.recompile_reasons)


def _every_module_output(mod: nn.Module, args: Any, out: Any) -> Any:
    return out + 1


def _every_module_input(mod: nn.Module, args: Any) -> Any:
    return (args[0] * 2,)


@pytest.mark.parametrize("branch", [False, True], ids=["whole", "regions"])
def test_a_global_hook_runs_once_per_module_not_on_the_wrapper(branch: bool) -> None:
    """A hook on every module's call runs for the module and its submodules, as in eager;
    the compiled wrapper is no module call of the program."""
    torch.manual_seed(0)
    model = _Net(branch).eval()
    cm = plait.compile(model, options={"cache": False})
    seen: list[str] = []
    handles = [
        nn_module.register_module_forward_hook(_every_module_output),
        nn_module.register_module_forward_pre_hook(_every_module_input),
        nn_module.register_module_forward_hook(lambda m, a, o: seen.append(type(m).__name__)),
    ]
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", CaptureFallbackWarning)
            for seed in range(3):
                seen.clear()
                want = model(_x(seed))
                eager_seen = list(seen)
                seen.clear()
                _close(cm(_x(seed)), want)
                assert seen == eager_seen or seed == 0, (seen, eager_seen)
    finally:
        for h in handles:
            h.remove()


def test_a_global_backward_hook_scales_each_gradient_once() -> None:
    torch.manual_seed(0)
    model = _Net(False).train()
    twin = _Net(False).train()
    twin.load_state_dict(model.state_dict())
    cm = plait.compile(twin, options={"cache": False})
    flag = nn_module._global_is_full_backward_hook  # NOTE: registering sets it for good
    handle = nn_module.register_module_full_backward_hook(
        lambda m, gin, gout: tuple(g * 2 if g is not None else None for g in gin)
    )
    try:
        for seed in range(2):
            x, y = _x(seed).requires_grad_(), _x(seed).requires_grad_()
            model(x).square().sum().backward()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", CaptureFallbackWarning)
                cm(y).square().sum().backward()
            _close(y.grad, x.grad)
            told = [str(w.message) for w in caught if w.category is CaptureFallbackWarning]
            assert seed > 0 or any("global module backward hook" in m for m in told), told
    finally:
        handle.remove()
        nn_module._global_is_full_backward_hook = flag


def test_a_hook_on_the_compiled_module_itself_runs_once() -> None:
    torch.manual_seed(0)
    model = _Net(False).eval()
    cm = plait.compile(model, options={"cache": False})
    cm.register_forward_hook(lambda m, a, o: o + 1)
    with torch.no_grad():
        for seed in range(3):
            _close(cm(_x(seed)), model(_x(seed)) + 1)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class _Blocks(nn.Module):
    """Identical blocks run as regions (a data-dependent branch): one program shared."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_Block(), _Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            x = x * 2
        for block in self.blocks:
            x = block(x)
        return x


def test_global_hooks_registered_later_reach_the_submodules_of_identical_blocks() -> None:
    """A block's recompile for the new hooks captures again: the program an identical block
    captured without them (shared between the blocks) is not rebuilt for it. It was: the
    Linear inside each block ran without the hooks (3.42 from eager at the worst element)."""
    torch.manual_seed(0)
    model = _Blocks().eval()
    _hooks_added_after_the_first_calls(model)


def _hooks_added_after_the_first_calls(model: nn.Module) -> None:
    """Two calls without global hooks, three with them, three after they are removed: each
    against eager."""
    cm = plait.compile(model, options={"cache": False})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        _compare(cm, model, range(2))
        with _hooked():
            _compare(cm, model, range(2, 5))
        _compare(cm, model, range(5, 8))

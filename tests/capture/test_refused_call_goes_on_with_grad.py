"""A call made with grad mode on whose capture is refused at a read of tensor data goes on
eagerly from the refusal with eager's autograd history (``plait.frontend.grad_replay``): the
program's calls before the refusal are made again on the caller's tensors, its Python before
the refusal runs once. Each model runs beside an eager twin (a deep copy) on fresh random
inputs: outputs, gradients of the inputs and parameters, buffers and side effects compared
after every call, the first (the refused capture's) included."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning
from tests.capture.test_refused_call_goes_on_eagerly import CountsThenReads
from tests.util import assert_bitwise


class NormsThenBranches(nn.Module):
    """A train-mode batch norm (running statistics written) before the read."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.norm = nn.Linear(4, 6), nn.BatchNorm1d(6)
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(len(self.seen))
        y = torch.relu(self.norm(self.lin(x)))
        return y.tanh() if y.mean().item() > 0.3 else y * 3


class WritesThenBranches(nn.Module):
    """An input written in place, and a value computed under no_grad, before the read."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        scratch.add_(1)
        with torch.no_grad():
            scale = self.lin(x).abs().mean()
        y = self.lin(x) * scale + scratch
        return y if bool((y > 0).any()) else -y


class DropsThenBranches(nn.Module):
    """A dropout (random draws) before the read: the same seed draws eager's masks."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.drop = nn.Linear(4, 8), nn.Dropout(0.5)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.drop(self.lin(x))
        return y.exp() if bool(y.sum() > 0) else y * torch.rand_like(y)


def _grads(m: nn.Module) -> list[Any]:
    return [p.grad for p in m.parameters()]


def _run(
    model: nn.Module,
    call: Callable[[nn.Module, torch.Generator], tuple[torch.Tensor, ...]],
    same: Callable[[nn.Module, nn.Module], None],
    *,
    as_function: bool,
) -> None:
    twin = copy.deepcopy(model)
    target = (lambda *a: model(*a)) if as_function else model
    compiled = plait.compile(target, options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed in range(3):
            args = call(model, torch.Generator().manual_seed(seed))
            twin_args = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
            torch.manual_seed(100 + seed)
            got = compiled(*args)
            after = torch.get_rng_state()
            torch.manual_seed(100 + seed)
            want = twin(*twin_args)
            assert_bitwise(after, torch.get_rng_state(), f"call {seed}: generator state")
            assert_bitwise(got, want, f"call {seed}: output")
            assert got.requires_grad == want.requires_grad
            got.square().sum().backward()
            want.square().sum().backward()
            for a, b in zip(args, twin_args):
                assert_bitwise(a.detach(), b.detach(), f"call {seed}: input after the call")
                if b.grad is not None:
                    assert_bitwise(a.grad, b.grad, f"call {seed}: input gradient")
            for g, h in zip(_grads(model), _grads(twin)):
                assert_bitwise(g, h, f"call {seed}: parameter gradient")
            same(model, twin)


def _x(rows: int) -> Callable[[nn.Module, torch.Generator], tuple[torch.Tensor, ...]]:
    return lambda m, g: (torch.randn(rows, 4, generator=g, requires_grad=True),)


@pytest.mark.parametrize("as_function", [True, False], ids=["function", "module"])
def test_a_counter_before_the_refusal_steps_once_and_gradients_are_eagers(
    as_function: bool,
) -> None:
    torch.manual_seed(0)

    def same(m: nn.Module, t: nn.Module) -> None:
        assert m.calls == t.calls

    _run(CountsThenReads(), _x(3), same, as_function=as_function)


def test_a_train_mode_batch_norm_before_the_refusal_updates_its_statistics_once() -> None:
    torch.manual_seed(1)

    def same(m: nn.Module, t: nn.Module) -> None:
        assert m.seen == t.seen
        for name, b in t.named_buffers():
            assert_bitwise(dict(m.named_buffers())[name], b, name)

    _run(NormsThenBranches().train(), _x(5), same, as_function=True)


def test_an_input_written_and_a_no_grad_value_before_the_refusal_are_eagers() -> None:
    torch.manual_seed(2)

    def call(m: nn.Module, g: torch.Generator) -> tuple[torch.Tensor, ...]:
        return torch.randn(3, 4, generator=g, requires_grad=True), torch.randn(3, 4, generator=g)

    def same(m: nn.Module, t: nn.Module) -> None:
        assert m.calls == t.calls

    _run(WritesThenBranches(), call, same, as_function=True)


def test_draws_before_the_refusal_are_eagers_from_the_same_seed() -> None:
    torch.manual_seed(3)

    def same(m: nn.Module, t: nn.Module) -> None:
        assert m.calls == t.calls

    _run(DropsThenBranches().train(), _x(3), same, as_function=True)


class AutocastAfterALinear(nn.Module):
    """A linear before the program's own autocast block, the read inside it: a replay at the
    read would run the linear under autocast (bfloat16), which eager did not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.lin(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.exp(a) * 2
            return y if bool(y.sum() > 0) else -y


class AutocastOffInside(nn.Module):
    """Called under the caller's autocast, a linear inside the program's
    ``autocast(enabled=False)`` block, the read after it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):
            a = self.lin(x)
        y = self.out(a)
        return y if bool(y.float().sum() > 0) else -y


class CompressesSaved(nn.Module):
    """Saved-tensor hooks that round what autograd saves to bfloat16, the read after them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.packs = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.packs += 1
        return t.to(torch.bfloat16)

    def unpack(self, t: torch.Tensor) -> torch.Tensor:
        return t.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            h = torch.tanh(self.lin(x)) * x
        return h if bool(h.sum() > 0) else -h


def test_a_call_before_the_programs_own_autocast_block_keeps_eagers_dtype() -> None:
    torch.manual_seed(4)
    _run(AutocastAfterALinear(), _x(3), lambda m, t: None, as_function=True)


def test_a_call_the_program_ran_without_the_callers_autocast_is_eagers() -> None:
    torch.manual_seed(5)
    model = AutocastOffInside()
    twin = copy.deepcopy(model)
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed in range(3):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            x_twin = x.detach().clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got, want = compiled(x), twin(x_twin)
            assert_bitwise(got, want, f"call {seed}: output")
            got.float().square().sum().backward()
            want.float().square().sum().backward()
            assert_bitwise(x.grad, x_twin.grad, f"call {seed}: input gradient")
            for g, h in zip(_grads(model), _grads(twin)):
                assert_bitwise(g, h, f"call {seed}: parameter gradient")


def test_saved_tensor_hooks_before_the_refusal_see_what_eagers_saw() -> None:
    torch.manual_seed(6)

    def same(m: nn.Module, t: nn.Module) -> None:
        assert m.packs == t.packs

    _run(CompressesSaved(), _x(3), same, as_function=True)


class InferenceThenBranches(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            a = x * 2
        return (a, x + 1) if bool(a.sum() > 0) else (a, x - 1)


class InferenceSavedForBackward(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            a = x * 2
        y = a * x  # NOTE: eager refuses to save an inference tensor for backward
        return y if bool(y.sum() > 0) else -y


def test_a_tensor_made_in_inference_mode_before_the_refusal_is_an_inference_tensor() -> None:
    torch.manual_seed(7)
    model = InferenceThenBranches()
    compiled = plait.compile(lambda x: model(x), options={"cache": False})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        for seed in range(3):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), requires_grad=True)
            got, want = compiled(x), model(x)
            for g, w in zip(got, want):
                assert_bitwise(g, w, f"call {seed}: output")
            assert [t.is_inference() for t in got] == [t.is_inference() for t in want]
    refusing = plait.compile(lambda x: InferenceSavedForBackward()(x), options={"cache": False})
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        InferenceSavedForBackward()(x)
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="cannot be saved"):
        warnings.simplefilter("ignore", CaptureFallbackWarning)
        refusing(x)

"""``torch.autocast`` around calls of one compiled module: each call gets what eager computes
under the autocast it is made in (result dtypes and values), never a program captured under
another one. Toggled on and off, its dtype changed, ``enabled=False`` nested inside, in
inference and in training (gradients' dtypes and values), the ops autocast treats specially
(linear, convolution and matmul cast down; softmax, log_softmax, layer norm and sum as the
CPU's autocast leaves them; ``torch.cat`` of mixed dtypes promoted). Autocast entered inside the
program is refused loudly (the recorded eager fallback, ``GraphCaptureError`` under
``fullgraph=True``), never captured without its casts."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plait
from plait.errors import CaptureFallbackWarning, GraphCaptureError
from tests.util import contract_tol


class _Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.lin(x)
        c = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return (
            h,
            c,
            F.softmax(c, -1),
            F.log_softmax(c, -1),
            self.norm(c),
            torch.cat([c, x], -1),
            c.sum(-1),
            h @ x.transpose(1, 2),
        )


MODES: dict[str, torch.dtype | None] = {"off": None, "bf16": torch.bfloat16, "f16": torch.float16}


@contextlib.contextmanager
def _autocast(mode: str) -> Iterator[None]:
    dtype = MODES[mode]
    if dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=dtype):
        yield


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, f"{what}: result {i} is {g.dtype}, eager's {w.dtype}"
        torch.testing.assert_close(g, w, **contract_tol("model", w.dtype), msg=f"{what}: {i}")


@pytest.mark.parametrize("fullgraph", [False, True])
def test_autocast_toggled_between_calls_of_one_module(fullgraph: bool) -> None:
    torch.manual_seed(0)
    model = _Mixed()
    compiled = plait.compile(copy.deepcopy(model), fullgraph=fullgraph)
    order = ["bf16", "off", "f16", "bf16", "off", "f16"]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error")  # NOTE: captured under each autocast, never eager
        for seed, mode in enumerate(order):
            x = _x(seed, 2, 5, 8)
            with _autocast(mode):
                _same(compiled(x), model(x), f"call {seed} ({mode})")
    assert len(compiled.specializations) == 3  # NOTE: one per autocast, each reused


def test_autocast_disabled_inside_an_autocast_region() -> None:
    torch.manual_seed(0)
    model = _Mixed()
    compiled = plait.compile(copy.deepcopy(model))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for seed in range(2):
            x = _x(seed, 2, 5, 8)
            _same(compiled(x), model(x), "autocast on")
            with torch.autocast("cpu", enabled=False):
                x = _x(10 + seed, 2, 5, 8)
                _same(compiled(x), model(x), "nested enabled=False")


class _NestedOff(nn.Module):
    """A program that turns autocast off for one layer itself, under the caller's autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(8, 8), nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x)
        with torch.autocast("cpu", enabled=False):
            g = self.b(h.float())
        return h, F.log_softmax(self.norm(g + h), -1)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_training_under_toggled_autocast(fullgraph: bool) -> None:
    """Gradients' dtypes and values, autocast on, off and on again (the off call must not run
    the autocast program, whose bfloat16 rounding is far outside float32's budget)."""
    torch.manual_seed(0)
    model = _NestedOff()
    reference = copy.deepcopy(model)
    compiled = plait.compile(model, fullgraph=fullgraph)
    for seed, mode in enumerate(["bf16", "off", "bf16", "off"]):
        x = _x(seed, 4, 8)
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        with _autocast(mode), warnings.catch_warnings():
            warnings.simplefilter("error")  # NOTE: a compiled training program, no fallback
            got, want = compiled(mine), reference(theirs)
        _same(got, want, f"call {seed} ({mode})")
        cot = [_x(100 + seed, *w.shape).to(w.dtype) for w in want]
        torch.autograd.backward(got, cot)
        torch.autograd.backward(want, cot)
        assert mine.grad is not None and theirs.grad is not None
        pairs = [("x", mine.grad, theirs.grad)]
        pairs += [
            (n, p.grad, q.grad)
            for (n, p), q in zip(model.named_parameters(), reference.parameters())
        ]
        for name, g, w in pairs:
            assert g is not None and w is not None, name
            assert g.dtype == w.dtype, f"{name}: {g.dtype} != {w.dtype}"
            # NOTE: a gradient through autocast's bfloat16 products carries their rounding
            dtype = torch.bfloat16 if mode == "bf16" else torch.float32
            torch.testing.assert_close(g, w, **contract_tol("model", dtype), msg=name)
        model.zero_grad()
        reference.zero_grad()


class _AutocastInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.lin(x).softmax(-1)


def test_autocast_entered_inside_the_program_is_refused_loudly() -> None:
    model = _AutocastInside()
    x = _x(0, 3, 8)
    with pytest.raises(GraphCaptureError):
        plait.compile(model, fullgraph=True)(x)
    compiled = plait.compile(model)
    with pytest.warns(CaptureFallbackWarning), torch.no_grad():
        got = compiled(x)
    with torch.no_grad():
        for seed in (1, 2):
            x = _x(seed, 3, 8)
            want = model(x)
            got = compiled(x)
            assert got.dtype == want.dtype == torch.bfloat16
            torch.testing.assert_close(got, want, **contract_tol("model", torch.bfloat16))


@pytest.mark.parametrize(("device", "other"), [("cpu", torch.float16), ("mps", torch.bfloat16)])
def test_autocast_dtype_read_while_autocast_is_off(device: str, other: torch.dtype) -> None:
    """A program's read of ``torch.get_autocast_dtype(device)``, for this machine's device or
    another's, follows ``torch.set_autocast_dtype`` after compiling."""

    def program(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.get_autocast_dtype(device)) * 2

    compiled = plait.compile(program)
    compiled(_x(0, 4))
    before = torch.get_autocast_dtype(device)
    assert before != other
    torch.set_autocast_dtype(device, other)
    try:
        x = _x(1, 4)
        got, want = compiled(x), program(x)
    finally:
        torch.set_autocast_dtype(device, before)
    assert got.dtype == want.dtype == other

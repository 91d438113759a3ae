"""A compiled program returns each output in the memory format eager gave it: plait runs
convolutions channels_last, and a convolution's result returned by the program came back
channels_last where eager's is row-major, so ``y.view(n, -1)`` after the call raised (a model
whose parent runs eagerly around a compiled region that ends in a convolution). A warm start
from the capture snapshot and an exported program return the same format."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import plait
from tests.util import assert_bitwise, contract_tol

TOL = contract_tol("model", torch.float32)


def _conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 6, 1)
    ).eval()


@pytest.mark.parametrize("channels_last_input", [False, True])
def test_a_convolution_output_has_eagers_memory_format(channels_last_input: bool) -> None:
    model = _conv_net()
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 12, 12, generator=gen)
            if channels_last_input:
                x = x.contiguous(memory_format=torch.channels_last)
            got, want = compiled(x), model(x)
            assert got.stride() == want.stride()
            torch.testing.assert_close(got, want, **TOL)


class _Flattens(nn.Module):
    """A data-dependent branch keeps the parent eager; its conv child is a compiled region."""

    def __init__(self) -> None:
        super().__init__()
        self.features = _conv_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x)
        flat = y.view(y.shape[0], -1)
        return flat * 2 if bool(flat.sum() > 0) else flat


def test_a_region_output_can_be_viewed_as_eagers() -> None:
    model = _Flattens().eval()
    compiled = plait.compile(model, options={"cache": False})
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad(), pytest.warns(plait.errors.CaptureFallbackWarning):
        for _ in range(3):
            x = torch.randn(2, 3, 12, 12, generator=gen)
            torch.testing.assert_close(compiled(x), model(x), **TOL)


def test_a_warm_start_returns_eagers_memory_format(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PLAIT_CACHE_DIR", str(tmp_path))
    model = _conv_net()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        first = plait.compile(model)(x)
        again = plait.compile(model)(x)
        want = model(x)
    assert first.stride() == want.stride() and again.stride() == want.stride()
    assert_bitwise(again, first, "warm start")


@pytest.mark.parametrize("channels_last_input", [False, True])
def test_an_exported_program_returns_eagers_memory_format(
    tmp_path, channels_last_input: bool
) -> None:
    """A channels_last example exports too: the guard that makes a compiled call of another
    layout capture again is not carried (an exported program has one specialization)."""
    model = _conv_net()
    x = torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(4))
    if channels_last_input:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        loaded = plait.load(plait.export(model, (x,)).save(tmp_path / "conv.plait"))
        got, want = loaded(x), model(x)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, **TOL)


def _channels_last_then_row_major(gen: torch.Generator) -> list[torch.Tensor]:
    """Inputs laid out channels_last on the capturing call, then row-major, then back."""
    xs = [torch.randn(2, 3, 12, 12, generator=gen) for _ in range(4)]
    return [
        x.contiguous(memory_format=torch.channels_last) if i % 2 == 0 else x
        for i, x in enumerate(xs)
    ]


def test_a_row_major_call_after_a_channels_last_capture_returns_eagers_format() -> None:
    """The format capture saw is the operands' (channels_last in, channels_last out): a later
    row-major call got a channels_last result where eager's is row-major, so ``y.view(n, -1)``
    raised after the compiled call only."""
    model = _conv_net()
    compiled = plait.compile(model, options={"cache": False})
    with torch.no_grad():
        for x in _channels_last_then_row_major(torch.Generator().manual_seed(5)):
            got, want = compiled(x), model(x)
            assert got.stride() == want.stride()
            torch.testing.assert_close(got, want, **TOL)
            if want.is_contiguous():  # NOTE: raised where the result came back channels_last
                torch.testing.assert_close(got.view(2, -1), want.view(2, -1), **TOL)


def _views_of_a_product(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2
    return y[0], y[1], y.transpose(1, 3)


def test_views_of_a_channels_last_result_follow_a_row_major_call() -> None:
    compiled = plait.compile(_views_of_a_product, options={"cache": False})
    for x in _channels_last_then_row_major(torch.Generator().manual_seed(6)):
        got, want = compiled(x), _views_of_a_product(x)
        for g, w in zip(got, want):
            assert g.stride() == w.stride()
            assert_bitwise(g, w, "a view of the product")

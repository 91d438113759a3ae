"""A training convolution's backward run as an im2col, GEMMs (plait's native kernel where the
columns' width is a multiple of 16 on an AVX-512 CPU, else MKL's) and a col2im
(``plait.codegen.gemm_conv``) gives eager's gradients within the contract's conv budget, for
strided, padded, dilated, 1x1, 3x3 and 7x7 convolutions, with or without the input's and the
bias's gradients; where the output's gradient holds an infinity, a padded convolution gives
eager's special values; the compile-time timing's choice is in the manifest either way, and the
``gemm_conv`` option turns it off. Timing is replaced here by a fixed verdict (the GEMMs' call
faster, or slower) so each test knows which call runs."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import plait
from plait.codegen import gemm_conv, pointwise_native, timed_choices, timed_matmul
from tests.conformance.models import randn, seeded
from tests.util import contract_tol


def _verdict(gemm_faster: bool) -> Any:
    real = timed_matmul.timings

    def timings(candidate: Any, default: Any, args: Any) -> tuple[float, float]:
        if "backward_fn" not in getattr(candidate, "__qualname__", ""):
            return real(candidate, default, args)
        return (0.0, 1.0) if gemm_faster else (1.0, 0.0)

    return timings


@pytest.fixture
def gemm_faster(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Timing says the GEMMs' call is faster (remembered decisions are forgotten around it)."""
    timed_choices.store().forget()
    monkeypatch.setattr(timed_matmul, "timings", _verdict(True))
    yield
    timed_choices.store().forget()


@pytest.fixture
def gemm_slower(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    timed_choices.store().forget()
    monkeypatch.setattr(timed_matmul, "timings", _verdict(False))
    yield
    timed_choices.store().forget()


def _backward_details(compiled: Any) -> list[str]:
    m = compiled.specializations[-1].compiled.manifest
    assert m.autograd and not m.fallbacks, m.fallbacks
    return [n["detail"] for n in m.executor["backward"]["evidence"]["nodes"]]


def _gradients(
    model: nn.Module, compiled: Any, x: torch.Tensor, g: torch.Tensor, wants_x: bool
) -> list[list[torch.Tensor | None]]:
    grads = []
    for m in (model, compiled):
        m.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_(wants_x)
        m(leaf).backward(g)
        conv = model if m is model else compiled
        grads.append([leaf.grad, *(p.grad for p in conv.parameters())])
    return grads


# NOTE: (in channels, out channels, kernel, stride, padding, dilation, bias, input size)
CASES = {
    "3x3-s1-p1": (8, 16, 3, 1, 1, 1, False, (6, 6)),
    "3x3-s2-p1": (8, 12, 3, 2, 1, 1, True, (9, 7)),
    "1x1-s2": (16, 8, 1, 2, 0, 1, False, (7, 8)),
    "1x1-s1": (6, 10, 1, 1, 0, 1, True, (5, 5)),
    "7x7-s2-p3": (3, 8, 7, 2, 3, 1, False, (14, 13)),
    "3x3-dilated-p2": (4, 6, 3, 1, 2, 2, True, (8, 8)),
    "uneven-stride-padding": (5, 7, (3, 2), (2, 1), (1, 0), 1, True, (8, 6)),
    # NOTE: C*kh*kw a multiple of 16: the products run the native kernel on an AVX-512 CPU
    "3x3-s1-p1-width-144": (16, 20, 3, 1, 1, 1, True, (7, 5)),
    "3x3-s2-p1-width-288": (32, 16, 3, 2, 1, 1, False, (9, 9)),
}


@pytest.mark.parametrize("wants_x", [True, False], ids=["input-grad", "no-input-grad"])
@pytest.mark.parametrize("case", list(CASES))
def test_gemm_backward_gives_eagers_gradients(case: str, wants_x: bool, gemm_faster: None) -> None:
    c, o, k, s, p, d, bias, (h, w) = CASES[case]
    model = seeded(3, lambda: nn.Conv2d(c, o, k, stride=s, padding=p, dilation=d, bias=bias))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NOTE: a backward that fell back to eager warns
        compiled = plait.compile(copy.deepcopy(model), backend="stax")
        for seed in (1, 2, 3):
            x = randn(2, c, h, w, seed=seed)
            g = randn(*model(x).shape, seed=seed + 50)
            want, got = _gradients(model, compiled, x, g, wants_x)
            for i, (a, b) in enumerate(zip(got, want)):
                assert (a is None) == (b is None), i
                if b is not None:
                    torch.testing.assert_close(a, b, **contract_tol("conv", torch.float32))
    details = _backward_details(compiled)
    assert sum(gemm_conv.DETAIL in d for d in details) == 1, details
    assert any("timed faster than PyTorch's kernel" in d for d in details), details


@pytest.mark.parametrize("channels", [4, 16], ids=["mkl-width", "native-width"])
@pytest.mark.parametrize("where", ["gradient", "input"])
def test_gemm_backward_gives_eagers_special_values(
    where: str, channels: int, gemm_faster: None
) -> None:
    """A padded tap times an infinite gradient: eager's kernel skips the tap (the weight's
    gradient is infinite, not NaN), so the call runs it for such a gradient. An infinite or NaN
    input enters the same products in both."""
    model = seeded(4, lambda: nn.Conv2d(channels, 6, 3, padding=1, bias=False))
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    x = randn(2, channels, 5, 5, seed=7)
    g = randn(2, 6, 5, 5, seed=8)
    t = g if where == "gradient" else x
    t[0, 1, 0, 0] = float("inf")
    t[1, 2, 4, 3] = float("-inf")
    t[1, 3, 2, 2] = float("nan") if where == "input" else t[1, 3, 2, 2]
    want, got = _gradients(model, compiled, x, g, True)
    for a, b in zip(got, want):
        assert a is not None and b is not None
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf())
        torch.testing.assert_close(a, b, equal_nan=True, **contract_tol("conv", torch.float32))
    assert any(gemm_conv.DETAIL in d for d in _backward_details(compiled))


@pytest.mark.skipif(not pointwise_native.available(), reason="the native kernel needs AVX-512")
def test_the_products_run_the_native_kernel_where_the_columns_width_allows(
    gemm_faster: None,
) -> None:
    """16 channels of a 3x3 kernel (columns 144 wide) run the native kernel; 8 (72 wide), MKL."""
    libraries = []
    for c in (16, 8):
        model = seeded(8, lambda c=c: nn.Conv2d(c, 12, 3, padding=1))
        compiled = plait.compile(copy.deepcopy(model), backend="stax")
        x, g = randn(2, c, 6, 6, seed=9), randn(2, 12, 6, 6, seed=10)
        want, got = _gradients(model, compiled, x, g, True)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **contract_tol("conv", torch.float32))
        [detail] = [d for d in _backward_details(compiled) if gemm_conv.DETAIL in d]
        libraries.append(detail)
    assert f"({gemm_conv.NATIVE_LIBRARY} products)" in libraries[0], libraries
    assert f"({gemm_conv.LIBRARY} products)" in libraries[1], libraries


def test_a_slower_gemm_backward_is_not_taken_and_the_manifest_says_why(
    gemm_slower: None,
) -> None:
    model = seeded(5, lambda: nn.Conv2d(4, 6, 3, padding=1))
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    x, g = randn(2, 4, 6, 6, seed=1), randn(2, 6, 6, 6, seed=2)
    want, got = _gradients(model, compiled, x, g, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **contract_tol("conv", torch.float32))
    details = _backward_details(compiled)
    assert not any(gemm_conv.DETAIL in d for d in details), details
    refused = [d for d in details if d.startswith("aten.convolution_backward")]
    assert len(refused) == 1 and "im2col GEMM backward not taken" in refused[0], details
    assert "PyTorch's kernel was faster at compile time" in refused[0]


def test_the_gemm_conv_option_off_runs_pytorchs_backward(gemm_faster: None) -> None:
    model = seeded(6, lambda: nn.Conv2d(4, 6, 3, padding=1))
    options = {"stax": {"gemm_conv": False}}
    compiled = plait.compile(copy.deepcopy(model), backend="stax", options=options)
    x, g = randn(2, 4, 6, 6, seed=3), randn(2, 6, 6, 6, seed=4)
    want, got = _gradients(model, compiled, x, g, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **contract_tol("conv", torch.float32))
    details = _backward_details(compiled)
    assert not any("im2col" in d for d in details), details


def test_a_grouped_convolution_keeps_pytorchs_backward(gemm_faster: None) -> None:
    model = seeded(7, lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2))
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    x, g = randn(2, 4, 6, 6, seed=5), randn(2, 6, 6, 6, seed=6)
    want, got = _gradients(model, compiled, x, g, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **contract_tol("conv", torch.float32))
    assert not any("im2col" in d for d in _backward_details(compiled))


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_gemm_backward_gives_eagers_special_values_for_a_non_finite_weight(
    value: str, gemm_faster: None
) -> None:
    """One infinite (or NaN) weight tap: oneDNN's input gradient holds NaNs at inputs that tap
    never reads (an unpadded strided convolution's last column), where the GEMMs' is finite;
    the call runs eager's kernel for such a gradient. Planted between calls, in both models."""
    model = seeded(5, lambda: nn.Conv2d(16, 16, 3, stride=2, bias=True))
    compiled = plait.compile(copy.deepcopy(model), backend="stax")
    for call in range(3):
        if call == 1:
            with torch.no_grad():
                for m in (model, compiled):
                    m.weight[0, 0, 0, 0] = float(value)
        x = randn(2, 16, 9, 9, seed=20 + call)
        g = randn(2, 16, 4, 4, seed=30 + call)
        want, got = _gradients(model, compiled, x, g, True)
        for a, b in zip(got, want):
            assert a is not None and b is not None
            assert torch.equal(a.isnan(), b.isnan()), f"call {call}"
            assert torch.equal(a.isinf(), b.isinf()), f"call {call}"
            torch.testing.assert_close(a, b, equal_nan=True, **contract_tol("conv", torch.float32))
    assert any(gemm_conv.DETAIL in d for d in _backward_details(compiled))

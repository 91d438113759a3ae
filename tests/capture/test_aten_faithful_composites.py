"""Composites with no capture rule whose ATen graphs used to be refused or unfaithful:

- in-place ops on tensors the call makes (``quantile``'s ``ceil_``/``lerp_``/``squeeze_``,
  ``hinge_embedding_loss``'s ``fill_`` then ``sub_`` then ``clamp_min_``: a chain of in-place
  ops on one fresh tensor) rebind that tensor to their out-of-place (or ``_copy``) form;
- a builtin whose decomposition is not eager's computation (``eigvalsh`` and the spectral
  norm decompose, under tracing, into an eigen/singular value decomposition that computes the
  vectors too) is the one ATen overload eager calls.

Each compiles whole (``fullgraph=True``) and gives eager's values on fresh inputs: bit for bit,
or within the numerical contract where plait's native kernels reduce (a loss's mean)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import plait
import plait.contract
from tests.capture.helpers import assert_same

TOL = plait.contract.load()


def _fresh(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _with_nan(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    x = _fresh(seed, shape)
    x[0, seed % shape[1]] = float("nan")
    return x


_TARGET = torch.where(_fresh(50, (4, 6)) > 0, 1.0, -1.0)  # NOTE: hinge's targets are 1 or -1


def _symmetric(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    a = _fresh(seed, shape)
    return a + a.mT


# name: (program, input maker, input shape, the ATen overloads the graph must run)
COMPOSITES: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[int, ...], set[str]]] = {
    "quantile": (lambda x: torch.quantile(x, 0.3, dim=1), _fresh, (5, 7), set()),
    "quantile_keepdim_linear": (
        lambda x: torch.quantile(x, 0.75, dim=0, keepdim=True),
        _fresh,
        (6, 4),
        set(),
    ),
    "nanquantile": (lambda x: torch.nanquantile(x, 0.6, dim=1), _with_nan, (4, 9), set()),
    "hinge_embedding_loss": (
        lambda x: F.hinge_embedding_loss(x, _TARGET, margin=0.7),
        _fresh,
        (4, 6),
        set(),
    ),
    "cosine_embedding_loss": (
        lambda x: F.cosine_embedding_loss(x, x.flip(0), torch.tensor([1.0, -1.0, 1.0, -1.0])),
        _fresh,
        (4, 6),
        set(),
    ),
    "eigvalsh": (torch.linalg.eigvalsh, _symmetric, (5, 5), {"aten.linalg_eigvalsh"}),
    "spectral_norm": (
        lambda x: torch.linalg.norm(x, ord=2),
        _fresh,
        (4, 6),
        {"aten.linalg_norm"},
    ),
    "matrix_norm_nuclear": (
        lambda x: torch.linalg.matrix_norm(x, ord="nuc"),
        _fresh,
        (3, 5),
        {"aten.linalg_matrix_norm.str_ord"},
    ),
}


# NOTE: losses end in a mean that plait's native reduction kernel sums in its own order
REDUCED = {"hinge_embedding_loss", "cosine_embedding_loss"}


def _within_contract(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    tol = TOL.tolerance("reduction", want.dtype)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    bound = tol.atol + tol.rtol * want.abs()
    assert bool(((got - want).abs() <= bound).all()), f"{what}: {got} vs {want}"


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_compiles_whole_and_matches_eager(name: str) -> None:
    fn, make, shape, overloads = COMPOSITES[name]
    compiled = plait.compile(fn, fullgraph=True)
    for seed in (0, 1, 2):  # NOTE: the capture draw, then fresh ones
        x = make(seed, shape)
        if name in REDUCED:
            _within_contract(compiled(x), fn(x), f"{name} seed {seed}")
        else:
            assert_same(compiled(x), fn(x), f"{name} seed {seed}")
    (spec,) = compiled.specializations
    assert spec.fallback_reason is None and spec.opaque_counts == {}
    assert spec.manifest.fallbacks == []
    assert overloads <= set(spec.manifest.graph["aten_externs"])
